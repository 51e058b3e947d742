"""The chart's `capture` values: off by default; on, the serving container gets `dspark serve --capture` with every
setting as dspark's own parser reads it, and a volume (an emptyDir of sizeLimit, requested as ephemeral storage, or
an existing claim); the SPS Job and bad values are left out or refused."""
from __future__ import annotations

import pytest

from dspark.integration.capture_settings import CaptureSettings
from dspark.ops.cli import build_parser
from dspark.ops.commands.settings_args import values_from_args

from tests.helm.chart_tools import CHART, find, find_job, pod_specs


def serving(docs: list[dict]) -> dict:
    return find(docs, "Deployment")["spec"]["template"]["spec"]


def container(pod: dict) -> dict:
    return next(c for c in pod["containers"] if c["name"] == "dspark")


def test_capture_is_off_by_default(render):
    pod = serving(render())
    assert not any(arg.startswith("--capture") for arg in container(pod)["args"])
    assert "capture" not in [v["name"] for v in pod["volumes"]]


def test_capture_passes_every_setting_and_mounts_an_emptydir_it_requests(render):
    plain = container(serving(render()))["resources"]["requests"]["ephemeral-storage"]
    docs = render("--set", "capture.enabled=true", "--set-json", "capture.capture_rate=0.25", "--set",
                  "capture.volume.sizeLimit=3Gi", "--set-json", r'capture.capture_redact=["\\d{4}", "key-[a-z]{8}"]',
                  "--set", "spsProfile.enabled=true")
    pod = serving(docs)
    args = container(pod)["args"]
    settings = values_from_args(build_parser(["serve"]).parse_args(["serve", *args]), CaptureSettings)
    assert settings == CaptureSettings(capture="/var/lib/dspark/capture/records", capture_rate=0.25,
                                       capture_redact=(r"\d{4}", "key-[a-z]{8}"))
    assert {"name": "capture", "mountPath": "/var/lib/dspark/capture"} in container(pod)["volumeMounts"]
    assert {"name": "capture", "emptyDir": {"sizeLimit": "3Gi"}} in pod["volumes"]
    requested = container(pod)["resources"]["requests"]["ephemeral-storage"]
    assert int(requested.removesuffix("Mi")) == int(plain.removesuffix("Mi")) + 3 * 1024
    job = pod_specs(docs)["Job/" + find_job(docs, "sps-profile")["metadata"]["name"]]
    assert not any(arg.startswith("--capture") for c in job["containers"] for arg in c["args"])


def test_capture_to_an_existing_claim(render):
    pod = serving(render("--set", "capture.enabled=true", "--set", "capture.volume.existingClaim=traffic"))
    assert {"name": "capture", "persistentVolumeClaim": {"claimName": "traffic"}} in pod["volumes"]


@pytest.mark.parametrize("flags, problem", [
    (["--set-json", "capture.capture_rate=1.5"], "/capture/capture_rate"),
    (["--set", "capture.volume.sizeLimit=lots"], "/capture/volume/sizeLimit"),
    (["--set", "capture.capture=/elsewhere"], "capture"),  # the folder is the volume's
    (["--set", "capture.enbled=true"], "enbled"),
])
def test_bad_capture_values_are_refused_by_the_schema(helm, flags, problem):
    result = helm("template", "dspark", str(CHART), *flags, check=False)
    assert result.returncode != 0 and problem in result.stderr, result.stderr
