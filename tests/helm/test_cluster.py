"""`make deploy` against a real API server (tests/helm/cluster.py: kube-apiserver, controller-manager and
scheduler v1.20.2 with etcd, on loopback; this test plays the kubelet). The GPU example installs, lands on
the GPU node, upgrades into a new ReplicaSet, rolls back and uninstalls; a release asking for more GPUs than
exist stays Pending with the scheduler's reason and is undone; the admin CLI's Kubernetes discovery finds the
replicas with the chart's admin-client ServiceAccount and nothing more. 1.20 serves neither policy/v1 nor the
Prometheus operator's CRDs, so the chart's capability guards are exercised for real. The tests run in order."""
from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark.ops.admin import discovery

from tests.helm.cluster import ControlPlane, Kubelet, pod_ready
from tests.helm.chart_tools import CHART, setup_k8s_tools
from tests.paths import REPO

pytestmark = pytest.mark.slow
NAMESPACE, RELEASE = "llm", "dspark"
GPU_VALUES = CHART / "examples" / "qwen3-8b-gpu.yaml"
GPU_NODE, CPU_NODE = "gpu-node-1", "cpu-node-1"
WAIT_S = 120.0  # failure bound for controllers to act; never a measurement


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlane(setup_k8s_tools(), tmp_path_factory.mktemp("k8s"))
    kubelet = Kubelet(plane)
    try:
        plane.start()
        # as a kubelet registers a node: its disk too (the serving pods request their emptyDirs' sizeLimits)
        base = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        plane.add_node(GPU_NODE, {"nvidia.com/gpu.present": "true"},
                       [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                       {**base, "nvidia.com/gpu": "8"})
        plane.add_node(CPU_NODE, {}, [], base)
        # what a GPU cluster provides: the runtime class, a volume for the hub cache, the hub token
        plane.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                     "handler": "nvidia"})
        plane.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "hub-cache"},
                     "spec": {"capacity": {"storage": "200Gi"}, "accessModes": ["ReadWriteOnce"],
                              "hostPath": {"path": str(plane.folder / "hub")}}})
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("-n", NAMESPACE, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_test")
        kubelet.start()
        yield plane
    finally:
        if kubelet.is_alive():
            kubelet.stop()
        plane.stop()


def make(plane: ControlPlane, target: str, *variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", target, f"NAMESPACE={NAMESPACE}", *variables], cwd=REPO,
                          env=plane.env(), text=True, capture_output=True)


def deploy(plane: ControlPlane, *variables: str) -> subprocess.CompletedProcess:
    result = make(plane, "deploy", f"VALUES={GPU_VALUES}", "DEPLOY_TIMEOUT=5m", *variables)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def server_pods(plane: ControlPlane, release: str = RELEASE) -> list[dict]:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=server"
    return [p for p in plane.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def eventually(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (result := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return result


def test_make_deploy_installs_the_gpu_example_onto_the_gpu_node(plane):
    out = deploy(plane).stdout
    assert "STATUS: deployed" in out and "REVISION: 1" in out
    pods = server_pods(plane)
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {GPU_NODE}
    assert all(pod_ready(p) for p in pods)
    # the API server's own verdict: requests equal limits in every container, init containers included
    assert {p["status"]["qosClass"] for p in pods} == {"Guaranteed"}
    router = plane.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=router")["items"]
    assert {p["spec"]["nodeName"] for p in router} == {CPU_NODE}  # no GPU toleration: not on the GPU node
    # two replicas download into a volume each: no ReadWriteOnce claim that a second node could not attach
    assert plane.get("pvc", "-n", NAMESPACE)["items"] == []


def run_job_container(plane: ControlPlane, job: dict, account: str, folder: Path, **files: Path):
    """A Job's one Python container, run here as the Job's ServiceAccount against this API server (its pod cannot
    run: no kubelet); `files` maps paths in the pod to stand-ins here."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    mounted = folder / "serviceaccount"  # what the pod would have mounted
    mounted.mkdir(exist_ok=True)
    secret = account_secret(plane, account)
    for key in ("namespace", "token"):
        (mounted / key).write_bytes(base64.b64decode(secret[key]))
    (mounted / "ca.crt").write_text((plane.folder / "certs" / "apiserver.crt").read_text())
    script = container["args"][0].replace("/var/run/secrets/kubernetes.io/serviceaccount", str(mounted))
    for inside, here in files.items():
        script = script.replace(inside, str(here))
    env = {**plane.env(), "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(plane.port)}
    return subprocess.run([sys.executable, "-c", script], env=env, text=True, capture_output=True)


def jobs_of(plane: ControlPlane, component: str) -> list[dict]:
    return plane.get("job", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}")["items"]


def test_the_token_job_makes_the_admin_tokens_once_with_only_its_own_rbac(plane, tmp_path):
    """Nothing random is rendered (GitOps): the Job makes the Secret on its first run and never changes a token."""
    (job,) = jobs_of(plane, "admin-tokens")
    first = run_job_container(plane, job, "dspark-admin-tokens", tmp_path)
    assert first.returncode == 0 and first.stdout.split() == [
        "dspark-admin-tokens", "201", "new", "tokens", "for:", "['grafana',", "'ops']"], first.stderr
    tokens = plane.get("secret", "-n", NAMESPACE, "dspark-admin-tokens")["data"]
    assert sorted(tokens) == ["grafana", "ops"]
    assert all(re.fullmatch(r"[0-9a-f]{48}", base64.b64decode(v).decode()) for v in tokens.values())
    again = run_job_container(plane, job, "dspark-admin-tokens", tmp_path)
    assert again.returncode == 0 and again.stdout.split()[1:] == ["200", "new", "tokens", "for:", "[]"]
    assert plane.get("secret", "-n", NAMESPACE, "dspark-admin-tokens")["data"] == tokens
    token = base64.b64decode(account_secret(plane, "dspark-admin-tokens")["token"]).decode()
    can_i = lambda *what: plane.kubectl("auth", "can-i", *what, "-n", NAMESPACE, f"--token={token}",  # noqa: E731
                                        check=False).stdout.strip()
    assert can_i("patch", "secrets/dspark-admin-tokens") == "yes"
    for forbidden in (("get", "secrets/other"), ("list", "secrets"), ("delete", "secrets/dspark-admin-tokens")):
        assert can_i(*forbidden) == "no", forbidden


def test_capability_guards_leave_out_what_the_cluster_does_not_serve(plane):
    manifest = subprocess.run(["helm", "get", "manifest", RELEASE, "-n", NAMESPACE], env=plane.env(), text=True,
                              capture_output=True, check=True).stdout
    kinds = {line.split(":", 1)[1].strip() for line in manifest.splitlines() if line.startswith("kind:")}
    # the example asks for both; 1.20 has no policy/v1 and no monitoring.coreos.com CRDs
    assert {"Deployment", "NetworkPolicy", "Role"} <= kinds
    assert {"PodDisruptionBudget", "ServiceMonitor"}.isdisjoint(kinds)


def account_secret(plane: ControlPlane, account: str) -> dict:
    """The data of a ServiceAccount's token Secret (1.20's token controller creates it)."""
    secrets = eventually(lambda: plane.get("sa", "-n", NAMESPACE, account).get("secrets"),
                         f"no token Secret for the ServiceAccount {account}")
    return plane.get("secret", "-n", NAMESPACE, secrets[0]["name"])["data"]


def admin_client_kubeconfig(plane: ControlPlane):
    """A kubeconfig holding the token of the chart's admin-client ServiceAccount."""
    token = base64.b64decode(account_secret(plane, "dspark-admin-client")["token"]).decode()
    return plane.write_kubeconfig(plane.folder / "admin-client.kubeconfig", token, NAMESPACE)


def test_the_admin_cli_discovers_the_replicas_with_only_the_charts_rbac(plane):
    kubeconfig = admin_client_kubeconfig(plane)
    expected = sorted(f"{p['status']['podIP']}:50051" for p in server_pods(plane))
    api = discovery.kube_api(kubeconfig)
    found = eventually(lambda: discovery.from_kubernetes(f"{NAMESPACE}/dspark-replicas", api=api) == expected
                       and expected, "discovery never listed the ready replicas")
    assert found == expected
    assert api.namespace == NAMESPACE and discovery.from_kubernetes("dspark-replicas", api=api) == expected
    can_i = lambda *what: plane.kubectl("auth", "can-i", *what, "-n", NAMESPACE, f"--token={api.token}",  # noqa: E731
                                        check=False).stdout.strip()
    assert can_i("list", "endpointslices.discovery.k8s.io") == "yes"
    assert can_i("get", "endpoints/dspark-replicas") == "yes"
    for forbidden in (("get", "endpoints/other"), ("list", "pods"), ("get", "secrets"),
                      ("watch", "endpointslices.discovery.k8s.io")):
        assert can_i(*forbidden) == "no", forbidden


def replica_sets(plane: ControlPlane) -> list[dict]:
    items = plane.get("rs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=server")["items"]
    return sorted(items, key=lambda rs: int(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]))


def policy_of(rs: dict) -> str:
    args = rs["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--policy") + 1]


def test_a_value_change_rolls_a_new_replica_set_and_keeps_the_admin_tokens(plane):
    tokens = plane.get("secret", "-n", NAMESPACE, "dspark-admin-tokens")["data"]
    upgrade = deploy(plane, "HELM_FLAGS=--set settings.policy=lagged --set spsProfile.enabled=true")
    assert "REVISION: 2" in upgrade.stdout
    old, new = replica_sets(plane)
    assert (policy_of(old), policy_of(new)) == ("causal", "lagged")
    assert new["status"].get("readyReplicas") == 2 and not old["spec"]["replicas"]
    assert {p["metadata"]["ownerReferences"][0]["name"] for p in server_pods(plane)} == {new["metadata"]["name"]}
    assert plane.get("secret", "-n", NAMESPACE, "dspark-admin-tokens")["data"] == tokens


def upgrade_with(plane: ControlPlane, chart: Path, *flags: str) -> subprocess.CompletedProcess:
    """make deploy's helm upgrade, with a chart of our own."""
    return subprocess.run(["helm", "upgrade", "--install", RELEASE, str(chart), "-n", NAMESPACE, "--values",
                           str(GPU_VALUES), "--rollback-on-failure", "--wait", "--timeout", "5m", *flags],
                          env=plane.env(), text=True, capture_output=True)


def test_the_sps_job_stores_its_table_with_only_its_own_rbac(plane, tmp_path):
    """The Job's `store` container; the profile it stores is a stand-in file."""
    (job,) = jobs_of(plane, "sps-profile")
    pod = eventually(lambda: plane.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=sps-profile")[
        "items"], "the SPS Job started no pod")
    assert pod[0]["spec"]["nodeName"] == GPU_NODE
    tables = tmp_path / "sglang"  # what `dspark serve --profile-sps-only` leaves in the Job's SPS directory
    tables.mkdir()
    table = tables / "Qwen3-8B-0123456789abcdef.json"
    table.write_text('{"sample_batch_tokens": [1, 8], "sample_steps_per_sec": [50.0, 40.0]}')
    for _ in range(2):  # creates, then replaces
        out = run_job_container(plane, job, "dspark-sps-profile", tmp_path,
                                **{"/var/cache/dspark/sps/sglang": tables})
        assert out.returncode == 0 and out.stdout.split() in (["dspark-sps", "200"], ["dspark-sps", "201"]), out.stderr
    stored = plane.get("configmap", "-n", NAMESPACE, "dspark-sps")["data"]
    assert stored == {table.name: table.read_text()}
    served = plane.get("deploy", "-n", NAMESPACE, RELEASE)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "sps", "configMap": {"name": "dspark-sps", "optional": True, "defaultMode": 420}} in served


def test_the_sps_job_survives_a_chart_version_bump_and_an_image_bump(plane, tmp_path):
    """A Job's pod template is immutable (helm/helm#7725): an upgrade to a new chart version, and then to a new
    image, with spsProfile.enabled must succeed, and a new image means a new Job (the old one is deleted)."""
    chart = tmp_path / "dspark"
    shutil.copytree(CHART, chart)
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace("version: 0.1.0", "version: 0.1.1").replace(
        'appVersion: "0.1.0"', 'appVersion: "0.1.1"'))
    sps = ("--set", "settings.policy=lagged", "--set", "spsProfile.enabled=true")
    (before,) = jobs_of(plane, "sps-profile")
    bumped = upgrade_with(plane, chart, *sps)
    assert bumped.returncode == 0, bumped.stderr
    (same,) = jobs_of(plane, "sps-profile")
    assert same["metadata"]["uid"] == before["metadata"]["uid"]  # its pod would run the same: not re-run
    assert same["metadata"]["labels"]["helm.sh/chart"] == "dspark-0.1.1"
    new_image = upgrade_with(plane, chart, *sps, "--set", "image.tag=0.1.1-sglang0.5.23")
    assert new_image.returncode == 0, new_image.stderr
    jobs = eventually(lambda: [j for j in jobs_of(plane, "sps-profile") if not j["metadata"].get("deletionTimestamp")]
                      if len(jobs_of(plane, "sps-profile")) == 1 else None, "the old SPS Job was never deleted")
    (job,) = jobs
    assert job["metadata"]["name"] != before["metadata"]["name"]
    (profile,) = [c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "profile"]
    assert profile["image"].endswith(":0.1.1-sglang0.5.23")


def test_rollback_returns_to_the_first_revisions_pods(plane):
    subprocess.run(["helm", "rollback", RELEASE, "1", "-n", NAMESPACE, "--wait", "--timeout", "5m"], env=plane.env(),
                   check=True, capture_output=True)
    current = replica_sets(plane)[-1]
    assert policy_of(current) == "causal" and current["status"].get("readyReplicas") == 2
    eventually(lambda: {p["metadata"]["ownerReferences"][0]["name"] for p in server_pods(plane)}
               == {current["metadata"]["name"]}, "the rolled-back pods never replaced the upgraded ones")


def test_a_release_asking_for_more_gpus_than_exist_stays_pending_and_is_undone(plane):
    greedy = subprocess.Popen(
        ["make", "--no-print-directory", "deploy", f"NAMESPACE={NAMESPACE}", "RELEASE=greedy", f"VALUES={GPU_VALUES}",
         "DEPLOY_TIMEOUT=20s", "HELM_FLAGS=--set gpu.count=16 --set replicaCount=1 --set router.enabled=false"],
        cwd=REPO, env=plane.env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        pod = eventually(lambda: next(iter(server_pods(plane, "greedy")), None), "the greedy release made no pod")
        name = pod["metadata"]["name"]

        def unschedulable():
            status = plane.get("pod", "-n", NAMESPACE, name)["status"]
            return next((c for c in status.get("conditions", []) if c["type"] == "PodScheduled"
                         and c.get("reason") == "Unschedulable" and "nvidia.com/gpu" in c["message"]), None)
        condition = eventually(unschedulable, "the scheduler never reported the pod unschedulable")
        assert "Insufficient nvidia.com/gpu" in condition["message"]
        assert plane.get("pod", "-n", NAMESPACE, name)["status"]["phase"] == "Pending"
        out = greedy.communicate(timeout=300)[0]
    finally:
        if greedy.poll() is None:
            greedy.kill()
            greedy.wait()
    assert greedy.returncode != 0 and "greedy" in out
    # --rollback-on-failure on a first install: the release is uninstalled again
    status = subprocess.run(["helm", "status", "greedy", "-n", NAMESPACE], env=plane.env(), capture_output=True)
    assert status.returncode != 0
    # one pod at a time (replicaCount 1, maxSurge 0): its downloads went to a claim, which the uninstall keeps
    assert plane.get("pvc", "-n", NAMESPACE, "greedy-dspark-hub-cache")["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_make_undeploy_removes_the_release_but_keeps_the_downloaded_models(plane):
    result = make(plane, "undeploy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert plane.get("deploy,svc,networkpolicy,role,sa", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=dspark")[
        "items"] == []
    eventually(lambda: server_pods(plane) == [], "the serving pods were never deleted")
    # helm.sh/resource-policy: keep
    assert plane.get("pvc", "-n", NAMESPACE, "greedy-dspark-hub-cache")["status"]["phase"] == "Bound"
