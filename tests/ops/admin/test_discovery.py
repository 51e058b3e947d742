"""Replica discovery: address lists, DNS A records, and reading Kubernetes EndpointSlices / Endpoints objects
(the API server itself is exercised by the deploy tests)."""
import pytest

from dspark.models.errors import ConfigError
from dspark.ops.admin import discovery


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
