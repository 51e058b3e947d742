"""Replica discovery: address lists, DNS A records, and reading Kubernetes EndpointSlices / Endpoints objects
(the API server itself is exercised by the deploy tests); IPv6 addresses; no token in plaintext to the pods an
EndpointSlice lists."""
import json
import re

import pytest

from dspark.integration.addresses import http_url, is_loopback, join_host_port, split_host_port
from dspark.models.errors import ConfigError
from dspark.ops.admin import discovery
from dspark.ops.cli import main


def test_lists_and_dns():
    assert discovery.from_list(["a:1,b:2", "[::1]:3"]) == ["a:1", "b:2", "[::1]:3"]
    assert discovery.from_dns("localhost:50051") == ["127.0.0.1:50051"]
    with pytest.raises(ConfigError, match="not host:port"):
        discovery.from_list(["nohost"])


def test_ready_endpoints_on_the_named_port():
    slices = {"items": [{"ports": [{"name": "admin", "port": 50051}, {"name": "http", "port": 30000}],
                         "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                                       {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                                       {"addresses": ["10.0.0.3"]}]}]}
    assert discovery.slice_addresses(slices, "admin") == ["10.0.0.1:50051", "10.0.0.3:50051"]
    endpoints = {"subsets": [{"ports": [{"name": "admin", "port": 50051}],
                              "addresses": [{"ip": "10.0.1.1"}], "notReadyAddresses": [{"ip": "10.0.1.2"}]}]}
    assert discovery.endpoint_addresses(endpoints, "admin") == ["10.0.1.1:50051"]
    assert discovery.endpoint_addresses(endpoints, "metrics") == []


def test_kubeconfig_without_a_context_is_named(tmp_path):
    path = tmp_path / "config"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(ConfigError, match="no current-context"):
        discovery.from_kubeconfig(path)


def test_ipv6_hosts_are_bracketed_and_loopback_is_told_apart():
    assert join_host_port("::1", 30000) == "[::1]:30000" == join_host_port("[::1]", 30000)
    assert http_url("::1", 30000) == "http://[::1]:30000" and http_url("10.0.0.1", 1, "https") == "https://10.0.0.1:1"
    assert split_host_port("[fd00::2]:50051") == ("fd00::2", 50051)
    assert [is_loopback(h) for h in ("127.0.0.2", "[::1]", "localhost", "10.0.0.1", "::", "fd00::1", "name")] == \
        [True, True, True, False, False, False, False]


def test_a_token_is_not_sent_in_plaintext_to_addresses_the_kubernetes_api_lists_off_loopback():
    discovery.refuse_plaintext_off_loopback(["127.0.0.1:50051", "[::1]:50051"], "--k8s-service")
    with pytest.raises(ConfigError) as refused:
        discovery.refuse_plaintext_off_loopback(["127.0.0.1:50051", "10.0.0.7:50051"], "--k8s-service")
    assert str(refused.value) == ("refusing to send the admin token in plaintext to ['10.0.0.7:50051'] (listed by "
                                  "--k8s-service): without TLS only loopback addresses get it; give --tls-ca, or "
                                  "pass --admin-insecure")


def test_dspark_admin_applies_the_refusal_to_k8s_service_unless_tls_or_insecure(tmp_path, monkeypatch, capsys):
    """`dspark admin get --k8s-service` through a kubeconfig whose API server is a real HTTP server on loopback
    that serves one EndpointSlice listing an off-loopback pod."""
    import http.server
    import threading

    slices = {"items": [{"ports": [{"name": "admin", "port": 50051}],
                         "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}]}]}

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(slices).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    api = http.server.HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    config = tmp_path / "kubeconfig"
    cluster = {"server": f"http://127.0.0.1:{api.server_port}"}
    config.write_text(json.dumps({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k"}}],
                                  "clusters": [{"name": "k", "cluster": cluster}]}))
    token = tmp_path / "reader"
    token.write_text("r" * 32)
    command = ["admin", "get", "--k8s-service", "prod/dspark", "--kubeconfig", str(config), "--token-file", str(token),
               "--timeout", "1", "--json"]
    try:
        assert main(command) == 2
        assert "refusing to send the admin token in plaintext to ['10.0.0.7:50051']" in capsys.readouterr().err
        assert main(command + ["--admin-insecure"]) == 1  # sent: the pod does not exist, so it is unreachable
        assert "10.0.0.7:50051" in json.loads(capsys.readouterr().out)["replicas"][0]["replica"]
    finally:
        api.shutdown()


@pytest.mark.parametrize("content, problem", [
    (b"clusters: [\n  - {", "is not a kubeconfig this client reads (ParserError)"),
    (b"\xff\xfe token: s3cret", "is not a kubeconfig this client reads (UnicodeDecodeError)"),
    (b"- just\n- a list\n", "is not a kubeconfig this client reads (AttributeError)"),
    (b"current-context: c\ncontexts: [{name: c, context: {user: u}}]\n", "lacks the field 'cluster'"),
    (b"current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {}}]\n",
     "lacks the field 'server'"),
    (b"current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: "
     b"{server: 'https://h', certificate-authority-data: '!!not base64'}}]\n", "(Error)"),
])
def test_a_kubeconfig_this_client_cannot_read_is_named_without_its_contents(tmp_path, content, problem):
    """Each was a traceback from `dspark admin --kubeconfig` (yaml, KeyError, binascii, ...)."""
    path = tmp_path / "config"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(problem)) as refused:
        discovery.from_kubeconfig(path)
    assert str(path) in str(refused.value) and "s3cret" not in str(refused.value)
