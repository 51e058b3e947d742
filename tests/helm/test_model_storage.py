"""Where the hub models are downloaded (hub.cache): a claim is mounted by more pods than its access mode allows
only over the chart's refusal, the GPU example downloads per pod, and NOTES warns about a revision that can move
(a branch or tag: pods downloading at different times would serve different weights)."""
from __future__ import annotations

import pytest

from tests.helm.chart_tools import CHART, GPU_EXAMPLE, LWS_FLAGS, find, find_job, pod_specs


def hub_cache(pod: dict) -> dict:
    return next(v for v in pod["volumes"] if v["name"] == "hub-cache")


def test_the_two_replica_gpu_example_downloads_per_pod_and_shares_no_claim(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set", "spsProfile.enabled=true")
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    pods = pod_specs(docs)
    for name in ("Deployment/dspark", "Job/" + find_job(docs, "sps-profile")["metadata"]["name"]):
        assert hub_cache(pods[name]) == {"name": "hub-cache", "emptyDir": {"sizeLimit": "100Gi"}}, name
        assert [c["name"] for c in pods[name]["initContainers"]][:1] == ["fetch-target"]
    claimed = [p for p in pods.values() for v in p.get("volumes", []) if "persistentVolumeClaim" in v]
    assert claimed == []


@pytest.mark.parametrize("flags, why", [
    (["--set", "replicaCount=2", "--set", "hub.cache.volume=claim"], "replicaCount=2"),
    (["--set", "hub.cache.existingClaim=models", "--set", "replicaCount=3"], "replicaCount=3"),
    (["--set", "hub.cache.volume=claim"], "rollingUpdate.maxSurge=1"),
    (["--set", "hub.cache.volume=claim", "--set", "rollingUpdate.maxSurge=0", "--set", "autoscaling.kind=hpa"],
     "autoscaling.kind=hpa"),
    (["--set", "hub.cache.volume=claim", "--set", "hub.cache.accessMode=ReadWriteOncePod",
      "--set", "lws.enabled=true", *LWS_FLAGS], "lws.enabled"),
])
def test_a_claim_that_cannot_attach_to_every_pod_is_refused_naming_the_values_to_change(helm, flags, why):
    result = helm("template", "dspark", str(CHART), *flags, check=False)
    assert result.returncode != 0
    assert f"more than one pod mounts the hub cache claim ({why}" in result.stderr, result.stderr
    assert "hub.cache.accessMode=ReadWriteMany" in result.stderr and "hub.cache.volume=emptyDir" in result.stderr


def test_a_read_write_many_claim_is_shared_by_every_pod_and_the_sps_job(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set", "hub.cache.accessMode=ReadWriteMany",
                  "--set", "spsProfile.enabled=true")
    assert find(docs, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
    claim = {"name": "hub-cache", "persistentVolumeClaim": {"claimName": "dspark-hub-cache"}}
    assert [hub_cache(p) for p in pod_specs(docs).values() if "initContainers" in p] == [claim, claim]


def test_one_pod_at_a_time_keeps_its_downloads_on_a_read_write_once_claim(render):
    """replicaCount 1 with maxSurge 0: no second serving pod; the SPS Job, which may land on another node,
    downloads for itself."""
    docs = render("--set", "rollingUpdate.maxSurge=0", "--set", "rollingUpdate.maxUnavailable=1",
                  "--set", "spsProfile.enabled=true")
    assert find(docs, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "persistentVolumeClaim" in hub_cache(find(docs, "Deployment")["spec"]["template"]["spec"])
    assert "emptyDir" in hub_cache(find_job(docs, "sps-profile")["spec"]["template"]["spec"])


def notes(helm, *flags: str) -> str:
    out = helm("install", "dspark", str(CHART), "--dry-run=client", *flags).stdout
    return out.split("NOTES:", 1)[1]


def test_notes_warn_when_a_revision_is_not_a_commit(helm):
    assert "not a commit" not in notes(helm, "--values", str(GPU_EXAMPLE))
    warned = notes(helm, "--values", str(GPU_EXAMPLE), "--set", "drafter.revision=v1.0")
    assert 'drafter.revision is "v1.0", not a commit' in warned and "target.revision" not in warned
    assert 'target.revision is "main"' in notes(helm)
