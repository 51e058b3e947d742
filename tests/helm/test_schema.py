"""values.schema.json: closed objects everywhere, the `settings` part derived from models/decoding/settings.py
(scripts/gen_chart_schema.py, checked here for drift), and bad values refused by real helm before anything
reaches a cluster."""
from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from dspark.models.decoding.settings import VerifySettings

from tests.helm.chart_tools import CHART, serve_settings
from tests.paths import REPO

# scripts/ is not a package: load the generator from its file
_spec = importlib.util.spec_from_file_location("gen_chart_schema", REPO / "scripts" / "gen_chart_schema.py")
gen_chart_schema = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_chart_schema)


def test_the_settings_schema_and_values_are_generated_from_the_settings_schema():
    """Regenerate with `python scripts/gen_chart_schema.py` when this fails."""
    schema, values = (CHART / "values.schema.json").read_text(), (CHART / "values.yaml").read_text()
    assert gen_chart_schema.generated_schema(schema) == schema
    assert gen_chart_schema.generated_values(values) == values
    assert yaml.safe_load(values)["settings"] == VerifySettings().to_dict()


def closed(schema: dict, path: str = "") -> list[str]:
    """Paths of object schemas that accept unknown keys (free-form Kubernetes objects are listed as such)."""
    out = []
    if schema.get("type") == "object" and "properties" in schema and schema.get("additionalProperties") is not False:
        out.append(path)
    for name, sub in schema.get("properties", {}).items():
        out += closed(sub, f"{path}.{name}")
    return out


def test_every_values_object_is_closed_and_every_value_has_a_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert closed(schema) == []

    def walk(values: dict, node: dict, path: str):
        for key, value in values.items():
            assert key in node.get("properties", {}), f"{path}.{key} has no schema"
            sub = node["properties"][key]
            if isinstance(value, dict) and "properties" in sub:
                walk(value, sub, f"{path}.{key}")
    walk(yaml.safe_load((CHART / "values.yaml").read_text()), schema, "")


def test_every_value_in_values_yaml_is_documented():
    """Each leaf key (objects are documented by their leaves) sits under a `# --` comment block."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        key, colon, value = line.strip().partition(":")
        if not colon or line.lstrip().startswith(("#", "-")) or not value.strip() or line.startswith(" " * 6):
            continue
        comments = []
        for above in reversed(lines[:i]):
            if not above.strip().startswith("#"):
                break
            comments.append(above.strip())
        assert any(c.startswith("# --") for c in comments), f"values.yaml:{i + 1}: {key} is undocumented"


@pytest.mark.parametrize("flags, problem", [
    (["--set", "settings.policy=greedy"], "/settings/policy"),
    (["--set", "settings.threshold=1.5"], "/settings/threshold"),
    (["--set", "settings.budget_fraction=0"], "/settings/budget_fraction"),
    (["--set", "settings.min_verify_length=-1"], "/settings/min_verify_length"),
    (["--set", "settings.max_batch_tokens=0"], "/settings/max_batch_tokens"),
    (["--set-json", 'settings.sts_temperatures=[1.0, 0]'], "/settings/sts_temperatures"),
    (["--set", "settings.polcy=causal"], "polcy"),
    (["--set", "gpu.count=-1"], "/gpu/count"),
    (["--set", "gpu.resourceName=gpu"], "/gpu/resourceName"),
    (["--set", "shmSize=lots"], "/shmSize"),
    (["--set", "target.source=ftp"], "/target/source"),
    (["--set", "target.source=s3"], "/target/uri"),  # s3 needs its uri
    (["--set", "http.apiKey.enabled=true", "--set-json", "http.apiKey.keys=[]"], "/http/apiKey/keys"),
    (["--set", "target.size=16GB"], "/target/size"),
    (["--set", "target.hubId="], "/target"),
    (["--set", "drafter.source=pvc"], "/drafter"),
    (["--set", "drafter.source=image", "--set", "drafter.path=relative/dir"], "/drafter"),
    (["--set", "probes.readiness.timeout=5"], "timeout"),
    (["--set", "admin.tls.secret=x"], "secret"),
    (["--set", "monitoring.kind=Prometheus"], "/monitoring/kind"),
    (["--set", "image.digest=latest"], "/image/digest"),
    (["--set", "tracing.protocol=udp"], "/tracing/protocol"),
    (["--set", "replicas=2"], "replicas"),
    (["--set", "hub.cache.volume=nfs"], "/hub/cache/volume"),
    (["--set", "router.digest=latest"], "/router/digest"),
    (["--set", "ingress.host=Not A Host"], "/ingress/host"),
    (["--set", "lws.network.ipcLok=true"], "ipcLok"),
    (["--set", "autoscaling.keda.metric=sum(x)"], "/autoscaling/keda/metric"),
])
def test_the_schema_refuses_bad_values(helm, flags, problem):
    result = helm("template", "dspark", str(CHART), *flags, check=False)
    assert result.returncode != 0 and problem in result.stderr, result.stderr


def test_the_template_refuses_a_readiness_timeout_within_sglangs_health_timeout(helm):
    result = helm("template", "dspark", str(CHART), "--set", "probes.readiness.timeoutSeconds=20", check=False)
    assert result.returncode != 0 and "must exceed probes.healthCheckTimeoutSeconds" in result.stderr


@pytest.mark.parametrize("settings", [
    {"policy": "threshold", "threshold": 0.4, "threshold_on": "confidence"},
    {"policy": "fixed", "max_verify_length": 3, "budget_fraction": 1.0, "max_batch_tokens": 1},
    {"policy": "causal", "sts_temperatures": [0.5, 1.0, 2.0], "trace_round_ratio": 0.0},
])
def test_settings_the_schema_accepts_are_settings_dspark_accepts(helm, settings):
    rendered = helm("template", "dspark", str(CHART), "--set-json", f"settings={json.dumps(settings)}",
                    "--show-only", "templates/deployment.yaml").stdout
    pod = yaml.safe_load(rendered)["spec"]["template"]["spec"]
    args = next(c for c in pod["containers"] if c["name"] == "dspark")["args"]
    assert serve_settings(args) == {**VerifySettings().to_dict(), **settings}
