"""How clients reach the OpenAI-compatible API: the router (two replicas, spread, a PDB, a pinned digest), an
Ingress with TLS, or a Gateway API HTTPRoute; each to the router when there is one, else the HTTP Service."""
from __future__ import annotations

import pytest

from tests.helm.chart_tools import CHART, find

DIGEST = "sha256:" + "ab" * 32
GATEWAY_API = ("--api-versions", "gateway.networking.k8s.io/v1/HTTPRoute")


def test_the_router_runs_two_spread_replicas_with_a_pdb_and_a_pinned_digest(render):
    docs = render("--set", "router.enabled=true", "--set", f"router.digest={DIGEST}", "--kube-version", "1.30.0")
    router = find(docs, "Deployment", "-router")["spec"]
    assert router["replicas"] == 2
    assert router["template"]["spec"]["containers"][0]["image"] == f"lmsysorg/sglang:v0.5.23@{DIGEST}"
    spread = router["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == \
        "kubernetes.io/hostname"
    pdb = find(docs, "PodDisruptionBudget", "-router")["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": router["selector"]["matchLabels"]}}
    one = render("--set", "router.enabled=true", "--set", "router.replicas=1", "--kube-version", "1.30.0")
    assert not [d for d in one if d["kind"] == "PodDisruptionBudget"]  # one replica: a PDB would block drains


@pytest.mark.parametrize("router, service, port", [(True, "dspark-router", 30080), (False, "dspark", 30000)])
def test_the_ingress_terminates_tls_for_the_api(render, router, service, port):
    docs = render("--set", f"router.enabled={str(router).lower()}", "--set", "ingress.enabled=true",
                  "--set", "ingress.host=llm.example.com", "--set", "ingress.tls.secretName=llm-tls",
                  "--set", "ingress.className=nginx")
    spec = find(docs, "Ingress")["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}]
    (path,) = spec["rules"][0]["http"]["paths"]
    assert spec["rules"][0]["host"] == "llm.example.com"
    assert path["backend"]["service"] == {"name": service, "port": {"number": port}}


def test_the_http_route_attaches_to_the_gateways_https_listener(render, helm):
    parent = '[{"name": "public", "namespace": "gateways", "sectionName": "https"}]'
    docs = render("--set", "router.enabled=true", "--set", "httpRoute.enabled=true", "--set-json",
                  f"httpRoute.parentRefs={parent}", "--set", "httpRoute.hostnames[0]=llm.example.com", *GATEWAY_API)
    spec = find(docs, "HTTPRoute")["spec"]
    assert spec["parentRefs"] == [{"name": "public", "namespace": "gateways", "sectionName": "https"}]
    assert spec["hostnames"] == ["llm.example.com"]
    assert spec["rules"][0]["backendRefs"] == [{"name": "dspark-router", "port": 30080}]
    for flags, message in ((["--set-json", f"httpRoute.parentRefs={parent}"], "needs the Gateway API"),
                           (list(GATEWAY_API), "httpRoute.parentRefs must name the Gateway")):
        refused = helm("template", "dspark", str(CHART), "--set", "httpRoute.enabled=true", *flags, check=False)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
