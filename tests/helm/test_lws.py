"""Multi-node serving with a LeaderWorkerSet (examples/lws-2node-tp16.yaml): the leader and the worker start
SGLang with the flags of SGLang's multi-node guide, as SGLang's own argument parser reads them; user arguments
append; both pod templates carry the settings checksum; the restricted-profile exception is opt-in and scoped;
the PDB covers whole groups; HPA is refused and KEDA scales the set."""
from __future__ import annotations

import shlex

import pytest

from tests.helm.chart_tools import CHART, LWS_EXAMPLE, LWS_FLAGS, find
# SGLang's multi-node guide (docs: deployment/multi-node, "Two-Node Tensor Parallelism"), its two commands as
# written there, after `python3 -m sglang.launch_server`
GUIDE_LEADER = ("--model-path M --tp 16 --dist-init-addr 172.16.4.52:20000 --nnodes 2 --node-rank 0 "
                "--host 0.0.0.0 --port 30000")
GUIDE_WORKER = "--model-path M --tp 16 --dist-init-addr 172.16.4.52:20000 --nnodes 2 --node-rank 1"
# what LWS puts in a group's pods: the leader's stable DNS name, the group size, the pod's index in the group
LEADER_ADDRESS = "dspark-lws-0.dspark-lws.llm"


def templates(docs: list[dict]) -> dict[str, dict]:
    group = find(docs, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    return {"leader": group["leaderTemplate"], "worker": group["workerTemplate"]}


def sglang_command(container: dict, index: int) -> list[str]:
    """The SGLang arguments `dspark serve` starts for this container (integration/server.py's launch_command:
    the model, host and port, then everything after `--`), with LWS's variables expanded as the kubelet does."""
    from dspark.integration.server import launch_command

    args = container["args"]
    value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
    tail = args[args.index("--") + 1:]
    env = {"LWS_LEADER_ADDRESS": LEADER_ADDRESS, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(index)}
    for name, setting in env.items():
        tail = [arg.replace(f"$({name})", setting) for arg in tail]
    command = launch_command(value("--target"), value("--host"), int(value("--port")), tail)[3:]
    assert command[:2] == ["--model-path", value("--target")]
    return ["--model-path", "M", *command[2:]]  # the guide's placeholder for the model


def parsed(argv: list[str]) -> dict:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return vars(parser.parse_args(argv))


def given(argv: list[str]) -> dict:
    """The settings a command line sets, as SGLang reads them (what differs from SGLang's defaults)."""
    defaults = parsed(["--model-path", "M"])
    return {k: v for k, v in parsed(argv).items() if v != defaults[k]}


@pytest.mark.parametrize("role, index, guide", [("leader", 0, GUIDE_LEADER), ("worker", 1, GUIDE_WORKER)])
def test_the_two_node_example_starts_sglang_as_its_multi_node_guide_does(render, role, index, guide):
    container = templates(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS))[role]["spec"]["containers"][0]
    command = sglang_command(container, index)
    chart, docs = given(command), given(shlex.split(guide))
    docs["dist_init_addr"] = f"{LEADER_ADDRESS}:5000"  # the guide's leader IP and port are its own
    # flag for flag: every setting of the guide's command, with the same value
    assert {k: chart.get(k) for k in docs} == docs
    settings = parsed(command)
    assert (settings["tp_size"], settings["nnodes"], settings["node_rank"]) == (16, 2, index)
    # and nothing else but the example's own sglangArgs and, on the worker, the listen address and port
    extra = set(chart) - set(docs)
    assert extra == {"mem_fraction_static"} | ({"host"} if role == "worker" else set())


def test_user_arguments_append_and_derived_ones_are_refused(render, helm):
    container = templates(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS))["leader"]["spec"]["containers"][0]
    tail = container["args"][container["args"].index("--") + 1:]
    assert tail == ["--tp-size", "16", "--dist-init-addr", "$(LWS_LEADER_ADDRESS):5000",
                    "--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
                    "--mem-fraction-static", "0.85"]
    for flag in ("--tp", "--nnodes=4", "--dist-init-addr"):
        refused = helm("template", "dspark", str(CHART), "--values", str(LWS_EXAMPLE), *LWS_FLAGS,
                       "--set-json", f'sglangArgs=["{flag}", "x"]', check=False)
        assert refused.returncode != 0 and f"sglangArgs sets {flag}, which the chart derives" in refused.stderr


def test_both_pod_templates_carry_labels_annotations_and_the_settings_checksum(render):
    flags = ("--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set", "podLabels.team=ml",
             "--set", "podAnnotations.owner=ops")
    before = templates(render(*flags))
    after = templates(render(*flags, "--set", "settings.policy=lagged"))
    for role in ("leader", "worker"):
        meta = before[role]["metadata"]
        assert meta["labels"]["team"] == "ml" and meta["annotations"]["owner"] == "ops"
        checksum = meta["annotations"]["dspark.dev/settings-checksum"]
        assert len(checksum) == 64
        assert after[role]["metadata"]["annotations"]["dspark.dev/settings-checksum"] != checksum
    assert before["worker"]["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"


def test_each_node_downloads_the_hub_models_once_into_its_own_volume(render):
    pods = templates(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set", "target.source=hub",
                            "--set", "drafter.source=hub", "--set", "target.revision=" + "a" * 40,
                            "--set", "drafter.revision=" + "b" * 40))
    for role, template in pods.items():
        spec = template["spec"]
        assert [c["name"] for c in spec["initContainers"]] == ["fetch-target", "fetch-drafter"], role
        assert next(v for v in spec["volumes"] if v["name"] == "hub-cache") == {
            "name": "hub-cache", "emptyDir": {"sizeLimit": "100Gi"}}, role


def test_the_restricted_profile_exception_is_opt_in_and_on_the_serving_containers_only(render):
    docs = render("--values", str(LWS_EXAMPLE), *LWS_FLAGS)
    for template in templates(docs).values():
        serving = template["spec"]["containers"][0]
        assert serving["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert serving["resources"]["limits"]["rdma/ib"] == serving["resources"]["requests"]["rdma/ib"] == "1"
    plain = templates(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set", "lws.network.ipcLock=false"))
    assert plain["leader"]["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # outside LWS the values do nothing
    docs = render("--set", "lws.network.ipcLock=true", "--set-json", 'lws.network.resources={"rdma/ib": "1"}')
    deployment = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert deployment["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "rdma/ib" not in deployment["resources"]["limits"]


def test_the_pdb_covers_whole_groups_and_keda_scales_the_set(render):
    docs = render("--values", str(LWS_EXAMPLE), *LWS_FLAGS)
    selector = find(docs, "PodDisruptionBudget", "dspark")["spec"]["selector"]
    assert selector["matchExpressions"] == [{"key": "app.kubernetes.io/component", "operator": "In",
                                             "values": ["server", "worker"]}]
    for template in templates(docs).values():
        labels = template["metadata"]["labels"]
        assert all(labels[k] == v for k, v in selector["matchLabels"].items())
    scaled = find(docs, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                        "name": "dspark-lws"}
    assert "replicas" not in find(docs, "LeaderWorkerSet")["spec"]


@pytest.mark.parametrize("flags, message", [
    (["--set", "autoscaling.kind=hpa"], "autoscaling.kind=hpa is not supported with lws.enabled"),
    (["--kube-version", "1.25.9"], "lws.enabled needs Kubernetes >= 1.26"),
    (["--set", "gpu.count=0"], "lws.enabled needs gpu.count >= 1"),
])
def test_what_lws_cannot_do_is_refused_with_a_message(helm, flags, message):
    result = helm("template", "dspark", str(CHART), "--values", str(LWS_EXAMPLE), *LWS_FLAGS, *flags, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize("flags", [
    [],  # the example: target and drafter on the claim `models`
    ["--set", "drafter.claimName=drafters", "--set", "drafter.path=/dspark/block7/"],
    ["--set", "target.path=", "--set", "drafter.source=image", "--set", "drafter.path=/opt/drafter"],
], ids=["one-claim", "two-claims", "whole-claim"])
def test_no_pod_mounts_one_claim_twice_and_each_model_is_a_sub_path(render, flags):
    """A pod naming one claim in two volumes hangs in ContainerCreating (kubernetes/kubernetes#127004)."""
    docs = render("--values", str(LWS_EXAMPLE), *LWS_FLAGS, *flags)
    values = {"target": ("models", "target"), "drafter": ("models", "drafter")}
    for flag in flags[1::2]:
        key, value = flag.split("=", 1)
        role, field = key.split(".")
        if field in ("claimName", "path"):
            claim, path = values[role]
            values[role] = (value, path) if field == "claimName" else (claim, value)
    for role, template in templates(docs).items():
        spec = template["spec"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert len(claims) == len(set(claims)), (role, claims)
        volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
                   if "persistentVolumeClaim" in v}
        container = spec["containers"][0]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"] if m["name"] in volumes}
        args = container["args"]
        for model in ("target", "drafter"):
            if "--set" in flags and f"{model}.source=image" in flags:
                continue
            claim, path = values[model]
            mount = mounts[f"/models/{model}"]
            assert volumes[mount["name"]] == claim and mount["readOnly"] is True, (role, model)
            assert mount.get("subPath", "") == path.strip("/"), (role, model)
            assert args[args.index(f"--{model}") + 1] == f"/models/{model}"


def selects(selector: dict, labels: dict) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions with In) selects these labels."""
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []) if e["operator"] == "In")


def test_the_workers_sit_under_a_network_policy_that_admits_the_rendezvous(render):
    """Under a namespace default-deny, the workers' ingress (the leader's rendezvous and NCCL/Gloo, on ports of
    their own choosing) must be admitted by a policy selecting them, and the leaders' by theirs."""
    docs = render("--values", str(LWS_EXAMPLE), *LWS_FLAGS)
    labels = {role: t["metadata"]["labels"] for role, t in templates(docs).items()}
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
    for target, source in (("worker", "leader"), ("worker", "worker"), ("leader", "worker")):
        covering = [p for p in policies if selects(p["podSelector"], labels[target])]
        assert covering, f"no NetworkPolicy selects the {target}s"
        assert any(not rule.get("ports") and any(selects(peer["podSelector"], labels[source])
                                                 for peer in rule.get("from", []))
                   for p in covering for rule in p["ingress"]), f"{source} -> {target} is not admitted on every port"
    worker_policy = find(docs, "NetworkPolicy", "-lws")["spec"]
    assert not selects(worker_policy["podSelector"], labels["leader"])  # the leaders keep the admin policy's rules
    off = render("--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set", "lws.networkPolicy.enabled=false")
    assert not [d for d in off if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-lws")]
