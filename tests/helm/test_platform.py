"""What a platform team runs into on a real cluster (issue 62): the API key from a Secret, model downloads behind a
mirror, proxy or private CA with a bounded time and declared disk, and pod templates that a chart-only upgrade
leaves alone."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helm.chart_tools import CHART, EXAMPLES, GPU_EXAMPLE, LWS_EXAMPLE, LWS_FLAGS, find, find_job, pod_specs

MIB = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


def mebibytes(quantity: str) -> int:
    return int(quantity[:-2]) * MIB[quantity[-2:]]


def serving(docs: list[dict]) -> dict:
    return next(c for c in find(docs, "Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == "dspark")


# -- the API key

def test_the_api_key_comes_from_a_generated_secret_as_files_and_never_as_an_argument(render):
    docs = render("--set", "http.apiKey.enabled=true", "--set-json", 'http.apiKey.keys=["current","next"]')
    container, pod = serving(docs), find(docs, "Deployment")["spec"]["template"]["spec"]
    args = container["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--api-key-file"] == [
        "/etc/dspark/api-keys/current", "/etc/dspark/api-keys/next"]
    assert {"name": "api-keys", "mountPath": "/etc/dspark/api-keys", "readOnly": True} in container["volumeMounts"]
    assert {"name": "api-keys", "secret": {"secretName": "dspark-api-keys", "defaultMode": 0o440}} in pod["volumes"]
    # made once in the cluster by the token Job, beside the admin tokens, with RBAC for those two Secrets only
    job = find_job(docs, "admin-tokens")["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert '[["dspark-admin-tokens",["ops","grafana"]],["dspark-api-keys",["current","next"]]]' in job
    assert find(docs, "Role", "-admin-tokens")["rules"][0]["resourceNames"] == ["dspark-admin-tokens",
                                                                                 "dspark-api-keys"]
    mine = render("--set", "http.apiKey.enabled=true", "--set", "http.apiKey.existingSecret=keys",
                  "--set", "admin.tokens.existingSecret=tokens")
    assert not [d for d in mine if d["kind"] in ("Job", "Secret") or d["metadata"]["name"].endswith("-admin-tokens")]
    assert {"name": "api-keys", "secret": {"secretName": "keys", "defaultMode": 0o440}} in find(
        mine, "Deployment")["spec"]["template"]["spec"]["volumes"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_no_rendered_pod_has_an_api_key_in_its_arguments(render, example):
    docs = render("--values", str(example), *LWS_FLAGS, "--set", "http.apiKey.enabled=true")
    for name, pod in pod_specs(docs).items():
        for container in pod.get("initContainers", []) + pod["containers"]:
            words = container.get("command", []) + container.get("args", [])
            assert not [w for w in words if w.split("=")[0] in ("--api-key", "--admin-api-key")], (name, words)
    leader = find(docs, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"] if "lws" in example.stem else None
    if leader:  # the leader serves HTTP and checks the key; the workers serve no API
        assert "--api-key-file" in leader["leaderTemplate"]["spec"]["containers"][0]["args"]
        assert "--api-key-file" not in leader["workerTemplate"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("flag", ["--api-key", "--api-key=sk-123", "--admin-api-key"])
def test_a_key_in_sglang_args_is_refused(helm, flag):
    result = helm("template", "dspark", str(CHART), "--set-json", f'sglangArgs=["{flag}", "x"]', check=False)
    assert result.returncode != 0
    assert f"sglangArgs sets {flag.split('=')[0]}: a key there sits in plain text in the pod spec" in result.stderr
    assert "http.apiKey" in result.stderr


# -- model downloads

def test_the_fetch_containers_get_extra_env_the_ca_bundle_and_a_timeout(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set-json",
                  'extraEnv=[{"name": "HF_ENDPOINT", "value": "https://mirror.example"}]',
                  "--set", "hub.caBundle.configMap=corp-ca", "--set", "hub.download.timeoutSeconds=5400",
                  "--set", "spsProfile.enabled=true")
    pods = [pod for pod in pod_specs(docs).values() if pod.get("initContainers")]
    assert len(pods) == 2  # the serving pods and the SPS Job
    for pod in pods:
        assert {"name": "ca-bundle", "configMap": {"name": "corp-ca", "items": [{"key": "ca.crt",
                                                                                 "path": "ca.crt"}]}} in pod["volumes"]
        fetches = [c for c in pod["initContainers"] if c["name"].startswith("fetch-")]
        assert [c["name"] for c in fetches] == ["fetch-target", "fetch-drafter"]
        for fetch in fetches:
            env = {e["name"]: e.get("value") for e in fetch["env"]}
            assert env["HF_ENDPOINT"] == "https://mirror.example"
            assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/etc/dspark/ca/ca.crt"
            assert {"name": "ca-bundle", "mountPath": "/etc/dspark/ca", "readOnly": True} in fetch["volumeMounts"]
            assert fetch["command"][:4] == ["timeout", "5400", "hf", "download"]


@pytest.mark.parametrize("flags", [[], ["--values", str(GPU_EXAMPLE), "--set", "spsProfile.enabled=true"],
                                   ["--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set", "target.source=hub",
                                    "--set", "drafter.source=hub"]], ids=["defaults", "gpu-example", "lws-hub"])
def test_every_disk_emptydir_is_sized_and_its_pod_requests_that_much_ephemeral_storage(render, flags):
    checked = []
    for name, pod in pod_specs(render(*flags)).items():
        disk = [v["emptyDir"] for v in pod.get("volumes", []) if "emptyDir" in v and
                v["emptyDir"].get("medium") != "Memory"]
        if not disk or "router" in name:
            continue  # the token Job and the helm test pods have none; the router's /tmp holds no cache
        assert all("sizeLimit" in v for v in disk), name
        requests = [c.get("resources", {}).get("requests", {}) for c in pod.get("initContainers", []) +
                    pod["containers"]]
        requested = sum(mebibytes(r["ephemeral-storage"]) for r in requests if "ephemeral-storage" in r)
        assert requested == sum(mebibytes(v["sizeLimit"]) for v in disk), name
        checked.append(name)
    assert len(checked) >= 2 if "lws" in str(flags) or "spsProfile" in str(flags) else checked


def test_a_hub_cache_smaller_than_the_stated_model_sizes_is_refused(helm, render):
    result = helm("template", "dspark", str(CHART), "--values", str(GPU_EXAMPLE), "--set", "target.size=90Gi",
                  "--set", "drafter.size=20Gi", check=False)
    assert result.returncode != 0
    assert ("hub.cache.size (100Gi) is below the hub models' stated size (target.size 90Gi + drafter.size 20Gi: "
            "112640 Mi)") in result.stderr
    render("--values", str(GPU_EXAMPLE), "--set", "target.size=80Gi", "--set", "drafter.size=20Gi")  # fits


def test_notes_count_the_download_before_the_startup_budget(helm):
    out = helm("install", "dspark", str(CHART), "--dry-run=client", "--set", "hub.download.timeoutSeconds=7200").stdout
    assert "each model download may take up to 7200 s first" in out.split("NOTES:", 1)[1]


# -- chart-only upgrades

def pod_templates(docs: list[dict]) -> dict:
    out = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]
        elif doc["kind"] == "LeaderWorkerSet":
            group = doc["spec"]["leaderWorkerTemplate"]
            out["LeaderWorkerSet"] = {role: group[role] for role in ("leaderTemplate", "workerTemplate")}
    return out


@pytest.mark.parametrize("example", [GPU_EXAMPLE, LWS_EXAMPLE], ids=lambda p: p.stem)
def test_a_chart_only_version_bump_leaves_every_pod_template_and_job_name_unchanged(helm, tmp_path, example):
    bumped = tmp_path / "dspark"
    shutil.copytree(CHART, bumped)
    chart = yaml.safe_load((bumped / "Chart.yaml").read_text())
    chart.update(version="0.2.0", appVersion="0.2.0")
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(chart))
    flags = ["--values", str(example), *LWS_FLAGS, "--set", "spsProfile.enabled=" + str("lws" not in example.stem)]
    before, after = ([d for d in yaml.safe_load_all(helm("template", "dspark", str(chart_dir), *flags).stdout) if d]
                     for chart_dir in (CHART, bumped))
    assert pod_templates(before) == pod_templates(after) and len(pod_templates(before)) >= 2
    assert find(after, "Service", "dspark")["metadata"]["labels"]["helm.sh/chart"] == "dspark-0.2.0"  # not pods


# -- placement and bounds of the other pods and objects

def test_the_token_job_and_the_helm_test_pods_land_where_the_image_is_and_can_pull_it(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set-json", 'imagePullSecrets=[{"name": "regcred"}]',
                  "--set", "http.apiKey.enabled=true")
    placed = {name: pod for name, pod in pod_specs(docs).items() if "tokens" in name or name.startswith("Pod/")}
    assert len(placed) == 3  # the token Job, the HTTP and the gRPC test
    for name, pod in placed.items():
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, name
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], name
        assert pod["imagePullSecrets"] == [{"name": "regcred"}], name


def test_topology_spread_constraints_reach_the_serving_pods_only(render):
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "dspark",
                                                 "app.kubernetes.io/component": "server"}}}]
    docs = render("--values", str(GPU_EXAMPLE),
                  "--set-json", f"scheduling.topologySpreadConstraints={json.dumps(spread)}")
    pods = pod_specs(docs)
    assert pods["Deployment/dspark"]["topologySpreadConstraints"] == spread
    assert "topologySpreadConstraints" not in pods["Deployment/dspark-router"]


def test_lws_takes_annotations_a_restart_policy_and_a_rollout_strategy(render):
    strategy = '{"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}'
    lws = find(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set", "lws.annotations.team=ml",
                      "--set", "lws.restartPolicy=None", "--set-json", f"lws.rolloutStrategy={strategy}"),
               "LeaderWorkerSet")
    assert lws["metadata"]["annotations"] == {"team": "ml"}
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "None"
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
    default = find(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS), "LeaderWorkerSet")
    assert default["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert "rolloutStrategy" not in default["spec"] and "annotations" not in default["metadata"]


def test_the_sps_job_has_a_deadline_and_the_http_route_a_timeout(render):
    docs = render("--set", "spsProfile.enabled=true", "--set", "spsProfile.activeDeadlineSeconds=900",
                  "--set", "httpRoute.enabled=true", "--set-json", 'httpRoute.parentRefs=[{"name": "gw"}]',
                  "--api-versions", "gateway.networking.k8s.io/v1/HTTPRoute")
    assert find_job(docs, "sps-profile")["spec"]["activeDeadlineSeconds"] == 900
    assert find(docs, "HTTPRoute")["spec"]["rules"][0]["timeouts"] == {"request": "600s"}


def test_the_admin_metrics_port_admits_the_monitoring_namespace_only(render):
    rules = find(render(), "NetworkPolicy", "-admin")["spec"]["ingress"]
    metrics = [r for r in rules if {"port": "admin-metrics", "protocol": "TCP"} in r.get("ports", [])]
    assert metrics == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                        "ports": [{"port": "admin-metrics", "protocol": "TCP"}]}]


def test_the_router_has_placement_of_its_own_pull_secrets_and_a_liveness_check(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set", "router.nodeSelector.pool=cpu",
                  "--set-json", 'router.tolerations=[{"key": "cpu-only", "operator": "Exists"}]',
                  "--set", "router.priorityClassName=critical", "--set-json", 'imagePullSecrets=[{"name": "regcred"}]')
    pod = pod_specs(docs)["Deployment/dspark-router"]
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]
    assert pod["priorityClassName"] == "critical" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["livenessProbe"]["tcpSocket"] == {"port": "http"}


@pytest.mark.parametrize("flags, said", [
    ([], "requestLimits.max_new_tokens is unset"),
    (["--set", "requestLimits.max_new_tokens=8192"], "the pods' grace period is 835 s"),
    (["--set", "requestLimits.max_new_tokens=2048"], None),
])
def test_notes_say_when_the_drain_cannot_finish_a_generation(helm, flags, said):
    notes = helm("install", "dspark", str(CHART), "--dry-run=client", *flags).stdout.split("NOTES:", 1)[1]
    assert said is None or said in notes
    for warning in ("requestLimits.max_new_tokens is unset", "the pods' grace period is"):
        assert (warning in notes) == bool(said and said.startswith(warning)), (flags, warning)


def test_no_service_links_in_the_serving_pods(render):
    assert find(render(), "Deployment", "dspark")["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_an_oci_model_is_an_image_volume_that_validates_and_older_clusters_are_refused(helm):
    flags = ("--set", "target.source=oci", "--set", "target.reference=registry.example.com/models/qwen3-8b:v1",
             "--set", "target.path=/weights/", "--set", "drafter.source=image", "--set", "drafter.path=/opt/drafter")
    text = helm("template", "dspark", str(CHART), "--kube-version", "1.35.0", *flags).stdout
    pod = find([d for d in yaml.safe_load_all(text) if d], "Deployment")["spec"]["template"]["spec"]
    assert {"name": "target-oci", "image": {"reference": "registry.example.com/models/qwen3-8b:v1",
                                            "pullPolicy": "IfNotPresent"}} in pod["volumes"]
    container = pod["containers"][0]
    assert {"name": "target-oci", "mountPath": "/models/target", "subPath": "weights",
            "readOnly": True} in container["volumeMounts"]
    assert container["args"][container["args"].index("--target") + 1] == "/models/target"
    assert "initContainers" not in pod  # nothing to download
    validate = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", "1.35.0",
                               "-"], input=text, text=True, capture_output=True)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    refused = helm("template", "dspark", str(CHART), "--kube-version", "1.32.0", *flags, check=False)
    assert refused.returncode != 0 and "target.source=oci needs image volumes with subPath" in refused.stderr


def test_an_object_storage_model_is_synced_into_the_hub_cache_by_the_aws_cli(render):
    docs = render("--values", str(GPU_EXAMPLE), "--set", "target.source=s3",
                  "--set", "target.uri=s3://models/qwen3-8b/",
                  "--set", "hub.objectStore.endpointUrl=https://storage.googleapis.com",
                  "--set", "hub.objectStore.credentialsSecret=gcs-hmac", "--set", "target.size=20Gi")
    pod = find(docs, "Deployment", "dspark")["spec"]["template"]["spec"]
    fetch = next(c for c in pod["initContainers"] if c["name"] == "fetch-target")
    assert fetch["command"][:5] == ["timeout", "3600", "aws", "s3", "sync"]
    assert fetch["args"] == ["--endpoint-url", "https://storage.googleapis.com", "s3://models/qwen3-8b/",
                             "/models/hub/s3/models/qwen3-8b"]
    env = {e["name"]: e for e in fetch["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "gcs-hmac",
                                                                           "key": "AWS_SECRET_ACCESS_KEY"}}
    args = pod["containers"][0]["args"]
    assert args[args.index("--target") + 1] == "/models/hub/s3/models/qwen3-8b"
    assert {"name": "hub-cache", "mountPath": "/models/hub", "readOnly": True} in pod["containers"][0]["volumeMounts"]
