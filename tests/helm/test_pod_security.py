"""Every pod the chart renders, for the defaults, each example and each optional part, passes the Pod Security
"restricted" profile, except the opt-in exception of LWS's serving containers (lws.network: IPC_LOCK,
hostPath volumes), which fails exactly where it was asked for."""
from __future__ import annotations

import pytest

from tests.helm.chart_tools import EXAMPLES, LWS_EXAMPLE, LWS_FLAGS, pod_specs
from tests.helm.pod_security import violations

VARIANTS = {
    "defaults": [],
    "everything": ["--set", "router.enabled=true", "--set", "spsProfile.enabled=true", "--set", "hub.tokenSecret=hf",
                   "--set", "admin.tls.secretName=tls", "--set", "admin.tls.requireClientCert=true"],
    "lws-without-the-exception": ["--values", str(LWS_EXAMPLE), "--set", "lws.network.ipcLock=false"],
    **{example.stem: ["--values", str(example)] for example in EXAMPLES if example != LWS_EXAMPLE},
}


def test_the_check_finds_what_the_restricted_profile_forbids():
    locked = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
              "seccompProfile": {"type": "RuntimeDefault"}}
    assert violations({"containers": [{"name": "ok", "securityContext": locked}]}) == []
    bad = {"hostNetwork": True, "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
           "containers": [{"name": "c", "securityContext": {**locked, "capabilities": {"drop": ["ALL"],
                                                                                   "add": ["SYS_ADMIN"]}},
                           "ports": [{"containerPort": 80, "hostPort": 80}]},
                          {"name": "d", "securityContext": {"runAsNonRoot": True}}]}
    assert sorted(violations(bad)) == sorted([
        "hostNetwork: true", "volume dev: hostPath", "c: adds capability SYS_ADMIN", "c: hostPort 80",
        "d: allowPrivilegeEscalation is not false", "d: seccompProfile None", "d: capabilities do not drop ALL"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_pod_is_restricted(render, variant):
    pods = pod_specs(render(*VARIANTS[variant], *LWS_FLAGS))
    assert pods
    assert {name: violations(pod) for name, pod in pods.items()} == {name: [] for name in pods}


def test_the_lws_exception_breaks_the_profile_only_where_it_was_asked_for(render):
    docs = render("--values", str(LWS_EXAMPLE), *LWS_FLAGS, "--set-json",
                  'lws.network.extraVolumes=[{"name": "ib", "hostPath": {"path": "/dev/infiniband"}}]',
                  "--set-json", 'lws.network.extraVolumeMounts=[{"name": "ib", "mountPath": "/dev/infiniband"}]')
    found = {name: violations(pod) for name, pod in pod_specs(docs).items()}
    serving = {name for name in found if name.startswith("LeaderWorkerSet/")}
    assert serving == {"LeaderWorkerSet/dspark-lws/leaderTemplate", "LeaderWorkerSet/dspark-lws/workerTemplate"}
    for name, problems in found.items():
        expected = ["volume ib: hostPath", "dspark: adds capability IPC_LOCK"] if name in serving else []
        assert problems == expected, name
