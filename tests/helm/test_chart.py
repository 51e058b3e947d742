"""The chart rendered by real helm v4: lint, golden renders of every example, the manifests against the JSON
schemas of several Kubernetes versions (kubernetes-validate --strict), and what each rendered resource must
say (security, probes, /dev/shm, discovery RBAC, the NetworkPolicy, capability guards).

Golden renders: DSPARK_UPDATE_GOLDEN=1 pytest tests/helm/test_chart.py rewrites tests/helm/golden/ (then
review the diff)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.helm.chart_tools import CHART, EXAMPLES, find, find_job
from tests.paths import REPO

GOLDEN = REPO / "tests" / "helm" / "golden"
KUBE_VERSIONS = ("1.25.0", "1.29.0", "1.33.0", "1.37.0")  # kubernetes-validate 1.37.0 ships 1.25..1.37
# what the goldens assume the cluster serves: the optional kinds' APIs (their guards are exercised for real
# against the 1.20 API server in test_cluster.py)
OPTIONAL_APIS = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor",
                 "keda.sh/v1alpha1/ScaledObject", "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet")
GOLDEN_FLAGS = ("--kube-version", "1.30.0", *[f for api in OPTIONAL_APIS for f in ("--api-versions", api)])
WRITABLE = {"/dev/shm", "/var/cache/dspark", "/home/dspark", "/tmp", "/models/hub"}


def masked(text: str) -> str:
    """The render with the dashboard (its own file, checked by test_the_dashboard_ships_with_the_chart) replaced by
    a placeholder."""
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboard"):
            doc["data"] = {"dspark.json": "<dashboards/dspark.json>"}
    return yaml.safe_dump_all([d for d in docs if d], sort_keys=False)


def test_lint_strict_passes_for_the_defaults_and_every_example(helm):
    helm("lint", "--strict", str(CHART))
    for example in EXAMPLES:
        helm("lint", "--strict", str(CHART), "--values", str(example))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_golden_render_of_each_example(helm, example):
    text = masked(helm("template", "dspark", str(CHART), "--namespace", "dspark", "--values", str(example),
                       *GOLDEN_FLAGS).stdout)
    golden = GOLDEN / f"{example.stem}.yaml"
    if os.environ.get("DSPARK_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.is_file(), f"no golden render for {example.name}: run with DSPARK_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{example.name} renders differently from {golden}: review, then update"


@pytest.mark.parametrize("example", [None, *EXAMPLES], ids=lambda p: p.stem if p else "defaults")
def test_two_renders_of_the_same_values_are_byte_identical(helm, example):
    """What Argo CD and Flux compare on every sync: nothing random (the admin tokens are made in the cluster)."""
    values = ["--values", str(example)] if example else []
    first, second = (helm("template", "dspark", str(CHART), *values, *GOLDEN_FLAGS).stdout for _ in range(2))
    assert first == second and "kind: Secret" not in first


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", [None, *EXAMPLES], ids=lambda p: p.stem if p else "defaults")
def test_rendered_manifests_validate_strictly(helm, example, kube_version):
    """Built-in kinds only: kubernetes-validate has no schema for custom resources (test_crds.py checks those
    against their CRDs' schemas)."""
    values = ["--values", str(example)] if example else []
    if example and yaml.safe_load(example.read_text()).get("lws", {}).get("enabled"):
        if kube_version < "1.26":
            pytest.skip("LeaderWorkerSet needs Kubernetes >= 1.26: the chart refuses it (test_lws.py)")
        values += ["--api-versions", "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"]
    text = helm("template", "dspark", str(CHART), "--kube-version", kube_version, *values).stdout
    validate = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", kube_version,
                               "-"], input=text, text=True, capture_output=True)
    assert validate.returncode == 0, validate.stdout + validate.stderr


def serving_container(docs: list[dict]) -> dict:
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "dspark")


def test_every_container_is_locked_down_and_writes_only_to_mounted_volumes(render):
    docs = render("--set", "router.enabled=true", "--set", "hub.tokenSecret=hf")
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    pods += [d["spec"] for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 4  # the server, the router and two `helm test` pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod.get("initContainers", []) + pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"], container["name"]
            assert ctx["capabilities"] == {"drop": ["ALL"]}, container["name"]
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
            assert {m["mountPath"] for m in container.get("volumeMounts", []) if not m.get("readOnly")} <= WRITABLE


@pytest.mark.parametrize("flags, size", [([], "16Gi"), (["--set", "shmSize=64Gi"], "64Gi"),
                                         (["--values", str(CHART / "examples" / "small-cpu.yaml")], "1Gi")])
def test_dev_shm_is_always_a_sized_memory_volume(render, flags, size):
    docs = render(*flags)
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in serving_container(docs)["volumeMounts"]


def test_probes_give_loading_a_long_budget_readiness_generates_and_liveness_sees_a_hung_engine(render):
    container = serving_container(render("--set", "probes.healthCheckTimeoutSeconds=40",
                                         "--set", "probes.readiness.timeoutSeconds=45",
                                         "--set", "liveness.liveness_window=600"))
    env = {e["name"]: e.get("value") for e in container["env"]}
    startup, readiness, liveness = (container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert readiness["httpGet"]["path"] == "/health_generate"
    assert readiness["timeoutSeconds"] > int(env["SGLANG_HEALTH_CHECK_TIMEOUT"]) == 40
    # SGLang answers /health without a generation when this is false: a busy server still starts
    assert startup["httpGet"]["path"] == "/health" and env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    # /health keeps answering 200 for a hung scheduler; /liveness fails after the window the chart passes to serve
    assert liveness["httpGet"]["path"] == "/liveness"
    assert container["args"][container["args"].index("--liveness-window") + 1] == "600"


@pytest.mark.parametrize("grace, sleep, drain", [(120, 5, "105"), (300, 0, "290"), (10, 5, "1")])
def test_shutdown_sleeps_then_drains_within_the_grace_period(render, grace, sleep, drain):
    docs = render("--set", f"scheduling.terminationGracePeriodSeconds={grace}",
                  "--set", f"scheduling.preStopSleepSeconds={sleep}")
    pod, container = find(docs, "Deployment")["spec"]["template"]["spec"], serving_container(docs)
    assert pod["terminationGracePeriodSeconds"] == grace
    assert container["args"][container["args"].index("--drain-timeout") + 1] == drain
    hook = container.get("lifecycle", {}).get("preStop")
    assert hook == ({"exec": {"command": ["sleep", str(sleep)]}} if sleep else None)


def test_gpu_scheduling_values_reach_the_pod(render):
    docs = render("--set", "gpu.resourceName=amd.com/gpu", "--set", "gpu.count=4",
                  "--set", "scheduling.runtimeClassName=nvidia", "--set", "scheduling.priorityClassName=llm",
                  "--set", "scheduling.schedulerName=volcano", "--set", "scheduling.nodeSelector.pool=gpu",
                  "--set", "scheduling.tolerations[0].key=gpu", "--set", "scheduling.tolerations[0].operator=Exists")
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    resources = serving_container(docs)["resources"]
    assert resources["limits"]["amd.com/gpu"] == resources["requests"]["amd.com/gpu"] == "4"
    assert (pod["runtimeClassName"], pod["priorityClassName"], pod["schedulerName"]) == ("nvidia", "llm", "volcano")
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert "--device" in (args := serving_container(docs)["args"]) and args[args.index("--device") + 1] == "cuda"


def test_discovery_rbac_is_exactly_what_the_admin_cli_reads(render):
    docs = render()
    role = find(docs, "Role", "-discovery")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["endpoints"], "resourceNames": ["dspark-replicas"], "verbs": ["get"]}]
    binding = find(docs, "RoleBinding", "-discovery")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dspark-admin-client", "namespace": "dspark"}]
    headless = find(docs, "Service", "-replicas")
    assert headless["spec"]["clusterIP"] == "None" and [p["name"] for p in headless["spec"]["ports"]] == ["admin"]
    assert find(docs, "Service", "-admin")["spec"]["type"] == "ClusterIP"
    server_sa = find(docs, "ServiceAccount", "dspark")
    assert server_sa["automountServiceAccountToken"] is False  # the servers themselves get no API access


def test_only_labelled_clients_reach_the_admin_port(render):
    policy = find(render("--set", "admin.networkPolicy.clientLabels.team=ml"), "NetworkPolicy")
    rules = policy["spec"]["ingress"]
    admin_rules = [r for r in rules if {"port": "admin", "protocol": "TCP"} in r.get("ports", [])]
    assert admin_rules == [{"from": [{"podSelector": {"matchLabels": {"dspark.dev/admin-client": "true",
                                                                         "team": "ml"}}}],
                            "ports": [{"port": "admin", "protocol": "TCP"}]}]
    open_rule = next(r for r in rules if "from" not in r)
    assert {p["port"] for p in open_rule["ports"]} == {"http"}  # admin-metrics: the monitoring namespace only


def test_admin_secrets_are_mounted_where_dspark_serve_reads_them(render):
    docs = render("--set", "admin.tls.secretName=admin-tls", "--set", "admin.tls.requireClientCert=true")
    container = serving_container(docs)
    args = container["args"]
    pairs = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--admin-t")}
    assert pairs == {"--admin-token-file": "/etc/dspark/admin-tokens/ops",
                     "--admin-tls-cert": "/etc/dspark/admin-tls/tls.crt",
                     "--admin-tls-key": "/etc/dspark/admin-tls/tls.key",
                     "--admin-tls-client-ca": "/etc/dspark/admin-tls/ca.crt"}
    assert "--admin-insecure" not in args
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["admin-tokens"] == "/etc/dspark/admin-tokens" and mounts["admin-tls"] == "/etc/dspark/admin-tls"
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "admin-tokens", "secret": {"secretName": "dspark-admin-tokens", "defaultMode": 0o440}} in pod[
        "volumes"]
    # the token Job makes that Secret in the cluster, with its own narrow RBAC
    job = find_job(docs, "admin-tokens")["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == "dspark-admin-tokens"
    assert '[["dspark-admin-tokens",["ops","grafana"]]]' in job["containers"][0]["args"][0]
    assert find(docs, "Role", "-admin-tokens")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["dspark-admin-tokens"],
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    mine = render("--set", "admin.tokens.existingSecret=mine")
    assert {"name": "admin-tokens", "secret": {"secretName": "mine", "defaultMode": 0o440}} in find(
        mine, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert not [d for d in mine if d["kind"] in ("Job", "Secret")]


def test_notes_never_print_a_token(helm):
    out = helm("install", "dspark", str(CHART), "--dry-run=client", "--namespace", "dspark").stdout
    notes = out.split("NOTES:", 1)[1]
    assert "get secret dspark-admin-tokens" in notes and "base64 -d" in notes
    assert "dspark admin get --k8s-service dspark/dspark-replicas" in notes


def test_optional_kinds_render_only_where_the_cluster_serves_their_api(render):
    flags = ["--set", "monitoring.kind=ServiceMonitor", "--set", "autoscaling.kind=keda",
             "--set", "podDisruptionBudget.enabled=true"]
    bare = {d["kind"] for d in render(*flags, "--kube-version", "1.30.0")}
    assert {"ServiceMonitor", "ScaledObject"}.isdisjoint(bare) and "PodDisruptionBudget" in bare
    served = {d["kind"] for d in render(*flags, *GOLDEN_FLAGS)}
    assert {"ServiceMonitor", "ScaledObject", "PodDisruptionBudget"} <= served
    # the autoscaler owns the replica count
    assert "replicas" not in find(render(*flags, *GOLDEN_FLAGS), "Deployment")["spec"]


def test_the_dashboard_ships_with_the_chart(render):
    dashboard = find(render(), "ConfigMap", "-dashboard")
    assert dashboard["data"]["dspark.json"] == (CHART / "dashboards" / "dspark.json").read_text().rstrip("\n")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize("source, flags, path, volume", [
    ("hub", ["--set", "target.hubId=Qwen/Qwen3-8B", "--set", "target.revision=v1"], "/models/hub/Qwen/Qwen3-8B/v1",
     {"name": "hub-cache", "emptyDir": {"sizeLimit": "100Gi"}}),  # the default surge pod: a download per pod
    ("pvc", ["--set", "target.claimName=models", "--set", "target.path=qwen3-8b"], "/models/target",  # by subPath
     {"name": "target-model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}),
    ("image", ["--set", "target.path=/opt/models/qwen"], "/opt/models/qwen", None),
])
def test_each_model_source_reaches_dspark_serve(render, source, flags, path, volume):
    docs = render("--set", f"target.source={source}", *flags, "--set", "drafter.source=image",
                  "--set", "drafter.path=/opt/drafter")
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    args = serving_container(docs)["args"]
    assert args[args.index("--target") + 1] == path and args[args.index("--drafter") + 1] == "/opt/drafter"
    fetch = [c for c in pod.get("initContainers", []) if c["name"] == "fetch-target"]
    assert [c["args"][:3] for c in fetch] == ([["Qwen/Qwen3-8B", "--revision", "v1"]] if source == "hub" else [])
    model_volumes = [v for v in pod["volumes"] if v["name"] in ("hub-cache", "target-model")]
    assert model_volumes == ([volume] if volume else [])


def test_multi_node_tensor_parallelism_renders_a_leader_worker_set(render, helm):
    """The leader serves (probes, admin), the workers only join SGLang's group (tests/helm/test_lws.py: the
    command lines)."""
    docs = render("--set", "lws.enabled=true", "--set", "lws.size=4", *GOLDEN_FLAGS)
    assert not [d for d in docs if d["kind"] == "Deployment"]
    group = find(docs, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    leader, worker = (group[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    assert group["size"] == 4
    assert "--admin-port" in leader["args"] and "readinessProbe" in leader
    assert "--admin-port" not in worker["args"] and "readinessProbe" not in worker
    # workers are not API endpoints: the Services select the leaders only
    assert group["workerTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    missing = helm("template", "dspark", str(CHART), "--set", "lws.enabled=true", check=False)
    assert missing.returncode != 0 and "needs the LeaderWorkerSet CRD" in missing.stderr


def test_the_sps_job_measures_as_the_servers_do_where_they_run_and_may_write_only_its_configmap(render, helm):
    docs = render("--set", "spsProfile.enabled=true", "--set", "scheduling.nodeSelector.pool=gpu")
    job = find_job(docs, "sps-profile")["spec"]["template"]["spec"]
    profile = next(c for c in job["initContainers"] if c["name"] == "profile")
    assert profile["command"] == ["dspark", "serve", "--profile-sps-only"]
    assert profile["resources"]["limits"]["nvidia.com/gpu"] == "1"
    served = serving_container(docs)
    # the same models, device and SGLang arguments as the servers, so the same cache key; no admin sidecar
    after_dashes = lambda args: args[args.index("--") + 1:]
    assert after_dashes(profile["args"]) == after_dashes(served["args"])
    for flag in ("--target", "--drafter", "--device"):
        assert profile["args"][profile["args"].index(flag) + 1] == served["args"][served["args"].index(flag) + 1]
    assert not [a for a in profile["args"] if a.startswith("--admin")]
    assert {"name": "DSPARK_SPS_DIR", "value": "/var/cache/dspark/sps"} in profile["env"]
    assert job["nodeSelector"] == {"pool": "gpu"} and job["serviceAccountName"] == "dspark-sps-profile"
    assert find(docs, "Role", "-sps-profile")["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["dspark-sps"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "sps", "configMap": {"name": "dspark-sps", "optional": True}} in pod["volumes"]
    # a start looks in every SPS directory's sglang/ (integration/sps_forward.py): the Job's tables are there
    assert {"name": "sps", "mountPath": "/etc/dspark/sps/sglang", "readOnly": True} in served["volumeMounts"]
    assert {"name": "DSPARK_SPS_DIR", "value": "/var/cache/dspark/sps:/etc/dspark/sps"} in served["env"]
    for conflict, message in ((("--set", "settings.sps_table=/etc/t.json"), "settings.sps_table gives one"),
                              (("--set", "lws.enabled=true", "--set", "gpu.count=8", "--api-versions",
                                "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet", "--kube-version", "1.30.0"),
                               "measures on one node")):
        refused = helm("template", "dspark", str(CHART), "--set", "spsProfile.enabled=true", *conflict, check=False)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr



def test_the_hpa_and_pod_monitor_alternatives(render):
    docs = render("--set", "autoscaling.kind=hpa", "--set", "monitoring.kind=PodMonitor", *GOLDEN_FLAGS)
    hpa = find(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "dspark"}
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "sglang:num_queue_reqs"
    endpoints = find(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "admin-metrics"]


def test_the_router_discovers_exactly_the_serving_pods_with_read_only_rbac(render):
    docs = render("--set", "router.enabled=true")
    args = find(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    selectors = args[args.index("--selector") + 1:]
    server = find(docs, "Deployment", "dspark")["spec"]["selector"]["matchLabels"]
    assert selectors == [f"{k}={v}" for k, v in sorted(server.items())]
    assert args[args.index("--service-discovery-port") + 1] == "30000"
    assert find(docs, "Role", "-router")["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                                       "verbs": ["get", "list", "watch"]}]


@pytest.mark.parametrize("monitor, selector", [
    ("ServiceMonitor", 'namespace="dspark",service="dspark-metrics"'),
    ("PodMonitor", 'namespace="dspark",job="dspark/dspark"'),
])
def test_the_keda_query_counts_only_this_releases_pods(render, helm, monitor, selector):
    docs = render("--set", "autoscaling.kind=keda", "--set", f"monitoring.kind={monitor}", *GOLDEN_FLAGS)
    trigger = find(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]
    assert trigger["query"] == f"sum(sglang:num_queue_reqs{{{selector}}})"
    unscoped = helm("template", "dspark", str(CHART), "--set", "autoscaling.kind=keda", *GOLDEN_FLAGS, check=False)
    assert unscoped.returncode != 0 and "autoscaling.kind=keda needs monitoring.kind" in unscoped.stderr


def test_metrics_are_on_unless_turned_off_and_never_off_under_a_monitor_or_autoscaler(render, helm):
    assert "--no-metrics" not in serving_container(render())["args"]  # `dspark serve` turns them on
    assert "--no-metrics" in serving_container(render("--set", "monitoring.metrics=false"))["args"]
    for reader in ("monitoring.kind=ServiceMonitor", "autoscaling.kind=hpa"):
        refused = helm("template", "dspark", str(CHART), "--set", "monitoring.metrics=false", "--set", reader,
                       check=False)
        assert refused.returncode != 0 and "monitoring.metrics is false" in refused.stderr, reader
