"""A fixed GPU pool: the GPU example rolls without a spare GPU (maxSurge 0, maxUnavailable 1) and every pod it
renders is in the Guaranteed QoS class, computed here as the kubelet does (the API server's own qosClass for the
serving pods is checked in test_cluster.py)."""
from __future__ import annotations

from tests.helm.chart_tools import GPU_EXAMPLE, find, pod_specs


def qos_class(pod: dict) -> str:
    """Kubernetes' QoS class of a pod spec: Guaranteed when every container, init containers included, limits cpu
    and memory and requests what it limits (an omitted request defaults to the limit); BestEffort when none
    requests or limits either; Burstable otherwise."""
    containers = pod.get("initContainers", []) + pod["containers"]
    guaranteed, empty = True, True
    for container in containers:
        resources = container.get("resources", {})
        limits, requests = resources.get("limits", {}), resources.get("requests", {})
        for name in ("cpu", "memory"):
            empty = empty and name not in limits and name not in requests
            guaranteed = guaranteed and name in limits and requests.get(name, limits[name]) == limits[name]
        # ephemeral storage is no QoS resource (the kubelet's supportedQoSComputeResources): requested, not limited
        guaranteed = guaranteed and all(limits.get(k) == q for k, q in requests.items() if k != "ephemeral-storage")
    return "BestEffort" if empty else "Guaranteed" if guaranteed else "Burstable"


def test_the_qos_rule_tells_the_three_classes_apart():
    def pod(*resources):
        return {"containers": [{"name": str(i), "resources": r} for i, r in enumerate(resources)]}
    full = {"limits": {"cpu": "1", "memory": "1Gi"}}
    assert qos_class(pod(full, {**full, "requests": {"cpu": "1"}})) == "Guaranteed"
    assert qos_class(pod(full, {})) == "Burstable"
    assert qos_class(pod({**full, "requests": {"cpu": "500m"}})) == "Burstable"
    assert qos_class(pod({"limits": {"memory": "1Gi"}})) == "Burstable"
    assert qos_class(pod({}, {})) == "BestEffort"


def test_every_pod_of_the_gpu_example_is_guaranteed_including_its_init_containers(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set", "spsProfile.enabled=true")
    pods = pod_specs(docs)
    assert len(pods) == 6  # the server, the router, the SPS and token Jobs and two `helm test` pods
    assert {name: qos_class(pod) for name, pod in pods.items()} == {name: "Guaranteed" for name in pods}
    serving = pods["Deployment/dspark"]
    assert [c["name"] for c in serving["initContainers"]] == ["fetch-target", "fetch-drafter"]
    server = serving["containers"][0]["resources"]
    assert server["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}
    # and the disk of its emptyDirs (100Gi hub cache, 3 x 10Gi scratch), requested only: no QoS resource
    assert server["requests"] == {**server["limits"], "ephemeral-storage": "133120Mi"}


def test_the_gpu_example_rolls_without_a_spare_gpu(render):
    strategy = find(render("--values", str(GPU_EXAMPLE)), "Deployment", "dspark")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    # the chart's default still surges (no capacity dip where a spare GPU exists)
    default = find(render(), "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert default == {"maxSurge": 1, "maxUnavailable": 0}
