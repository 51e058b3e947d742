"""The chart's custom resources against their CRDs' schemas, and the LeaderWorkerSet's pod templates against
Kubernetes' own.

ScaledObject (KEDA), ServiceMonitor and PodMonitor (Prometheus operator) are checked with the validators that
kubernetes-models-ts generates from those projects' CRDs, installed from npm at pinned versions
(@kubernetes-models/keda 2.0.0, @kubernetes-models/prometheus-operator 6.0.0; scripts/setup_k8s_tools.sh).
They check types, enums and required fields; like an API server without strict field validation they do not
reject unknown fields.

What was tried for the CRDs themselves, to load them into the test API server: the Go module proxy (the
CRD YAMLs are in sigs.k8s.io/lws, github.com/kedacore/keda/v2 and prometheus-operator's main module) does not
resolve from this machine; Debian bookworm has no KEDA, Prometheus operator or LWS package; on PyPI
cloudcoil-models-keda / -prometheus-operator are pydantic models without the CRDs, and npm's search endpoint
is not served here. No package found ships LeaderWorkerSet's schema at all, so its pod templates, which
kubernetes-validate skips inside a custom resource, are validated here as Pods instead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helm.chart_tools import CHART, GPU_EXAMPLE, LWS_EXAMPLE, LWS_FLAGS, find, setup_k8s_tools

CUSTOM = {"ScaledObject", "ServiceMonitor", "PodMonitor"}
CHECK = Path(__file__).with_name("crd_check.mjs")


@pytest.fixture(scope="module")
def crd_models() -> Path:
    return setup_k8s_tools().parent / "crd-models"


def checked(crd_models: Path, resources: list[dict]) -> list[dict]:
    out = subprocess.run(["node", str(CHECK), str(crd_models)], input=json.dumps(resources), text=True,
                         capture_output=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("flags", [
    ["--values", str(LWS_EXAMPLE)],
    ["--values", str(GPU_EXAMPLE), "--set", "autoscaling.kind=keda"],
    ["--values", str(GPU_EXAMPLE), "--set", "monitoring.kind=PodMonitor", "--set", "autoscaling.kind=keda"],
], ids=["lws-example", "gpu-example", "pod-monitor"])
def test_every_custom_resource_matches_its_crd_schema(render, crd_models, flags):
    resources = [d for d in render(*flags, *LWS_FLAGS, "--api-versions", "monitoring.coreos.com/v1/PodMonitor")
                 if d["kind"] in CUSTOM]
    assert len(resources) == 2
    assert checked(crd_models, resources) == [{"kind": r["kind"], "name": r["metadata"]["name"], "error": None}
                                              for r in resources]


def test_the_schemas_refuse_a_wrong_type_and_a_missing_field(crd_models):
    scaled = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "bad"},
              "spec": {"scaleTargetRef": {"name": "d"}, "minReplicaCount": "one", "triggers": []}}
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "bad"},
               "spec": {"endpoints": [{"port": "metrics"}]}}
    errors = [r["error"] for r in checked(crd_models, [scaled, monitor])]
    assert "minReplicaCount must be integer" in errors[0] and "selector" in errors[1]


@pytest.mark.parametrize("kube_version", ["1.29.0", "1.33.0", "1.37.0"])
def test_the_leader_worker_set_pod_templates_are_valid_pods(helm, kube_version):
    rendered = helm("template", "dspark", str(CHART), "--values", str(LWS_EXAMPLE), *LWS_FLAGS[2:],
                    "--kube-version", kube_version).stdout
    (lws,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "LeaderWorkerSet"]
    group = lws["spec"]["leaderWorkerTemplate"]
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": role.lower(), **group[role]["metadata"]},
             "spec": group[role]["spec"]} for role in ("leaderTemplate", "workerTemplate")]
    validate = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k",
                               kube_version, "-"], input=yaml.safe_dump_all(pods), text=True, capture_output=True)
    assert validate.returncode == 0, validate.stdout + validate.stderr


INFERENCE_POOL_API = "inference.networking.k8s.io/v1/InferencePool"
INFERENCE_POOL_SCHEMA = Path(__file__).with_name("inferencepool_v1.schema.json")
INFERENCE_POOL_GOLDEN = Path(__file__).with_name("golden") / "inference-pool.yaml"
POOL_FLAGS = ("--values", str(GPU_EXAMPLE), "--set", "inferencePool.enabled=true",
              "--set", "inferencePool.endpointPicker.serviceName=dspark-epp", "--set", "httpRoute.enabled=true",
              "--set-json", 'httpRoute.parentRefs=[{"name": "inference-gateway", "sectionName": "https"}]',
              "--api-versions", INFERENCE_POOL_API, "--api-versions", "gateway.networking.k8s.io/v1/HTTPRoute")


def pool_problems(pool: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(INFERENCE_POOL_SCHEMA.read_text()))
    return sorted(error.message for error in validator.iter_errors(pool))


def test_the_inference_pool_and_its_route_match_their_golden_render_and_the_pool_its_schema(helm):
    """The Gateway API Inference Extension's InferencePool (v1): the serving pods, the HTTP port, the endpoint
    picker; the HTTPRoute sends to the pool. DSPARK_UPDATE_GOLDEN=1 rewrites the golden render."""
    text = helm("template", "dspark", str(CHART), "--namespace", "dspark", *POOL_FLAGS,
                "--show-only", "templates/inferencepool.yaml", "--show-only", "templates/httproute.yaml").stdout
    if os.environ.get("DSPARK_UPDATE_GOLDEN"):
        INFERENCE_POOL_GOLDEN.write_text(text)
    assert text == INFERENCE_POOL_GOLDEN.read_text(), "the InferencePool renders differently: review, then update"
    docs = [d for d in yaml.safe_load_all(text) if d]
    pool = next(d for d in docs if d["kind"] == "InferencePool")
    assert pool_problems(pool) == []
    route = next(d for d in docs if d["kind"] == "HTTPRoute")["spec"]["rules"][0]
    assert route["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                     "name": pool["metadata"]["name"]}]


def test_the_pool_selects_the_serving_pods_which_say_they_run_sglang(render):
    docs = render(*POOL_FLAGS)
    pool = next(d for d in docs if d["kind"] == "InferencePool")["spec"]
    labels = find(docs, "Deployment", "dspark")["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert labels["inference.networking.k8s.io/engine-type"] == "sglang"
    assert pool["targetPorts"] == [{"number": 30000}]


def test_the_pool_schema_refuses_what_the_api_server_would(render):
    pool = next(d for d in render(*POOL_FLAGS) if d["kind"] == "InferencePool")
    bad = json.loads(json.dumps(pool))
    bad["spec"]["endpointPickerRef"].pop("port")
    bad["spec"]["endpointPickerRef"]["failureMode"] = "Retry"
    bad["spec"]["targetPorts"] = []
    problems = pool_problems(bad)
    assert len(problems) == 3 and "'port' is a required property" in problems
    assert any("Retry" in p for p in problems) and any("[] should be non-empty" in p for p in problems)


@pytest.mark.parametrize("flags, message", [
    ([], "inferencePool.enabled needs the Gateway API Inference Extension's InferencePool CRD"),
    (["--api-versions", INFERENCE_POOL_API, "--set", "inferencePool.endpointPicker.serviceName="],
     "inferencePool.endpointPicker.serviceName must name the endpoint picker's Service"),
])
def test_what_the_pool_needs_is_refused_with_a_message(helm, flags, message):
    result = helm("template", "dspark", str(CHART), "--set", "inferencePool.enabled=true",
                  "--set", "inferencePool.endpointPicker.serviceName=epp", *flags, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
