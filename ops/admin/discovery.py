"""Which replicas a fleet command addresses: a list, a DNS name's A records, or a Kubernetes Service.

    --replica host:port          one replica (repeatable; comma-separated lists too)
    --dns name:port              every A record of `name` (a headless Service gives one per ready pod)
    --k8s-service [ns/]name      the ready endpoints of a Service, read from the Kubernetes API: its
                                 EndpointSlices (discovery.k8s.io/v1, or v1beta1 on older clusters), else its
                                 Endpoints; the port named by --k8s-port-name (default "admin")

Without TLS (--tls-ca) a token goes in plaintext, so `dspark admin` refuses to send one to an address the
Kubernetes API listed off loopback unless --admin-insecure (refuse_plaintext_off_loopback).

The API is reached with the pod's service account when running in a cluster (KUBERNETES_SERVICE_HOST and
the mounted token), else with the current context of the kubeconfig ($KUBECONFIG or ~/.kube/config): bearer
token or client certificate, CA or insecure-skip-tls-verify. It needs only get/list on endpointslices and
endpoints in the namespace (the chart's RBAC grants exactly that).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dspark.integration.addresses import http_url, is_loopback, join_host_port, split_host_port
from dspark.models.errors import ConfigError, shown

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_KUBECONFIG_BYTES = 16 << 20  # a kubeconfig of many clusters, with inline certificates, is well under this


def from_list(values: list[str]) -> list[str]:
    out = []
    for value in values:
        for address in filter(None, (v.strip() for v in value.split(","))):
            out.append(join_host_port(*split_host_port(address)))
    return out


def refuse_plaintext_off_loopback(addresses: list[str], source: str) -> None:
    """A bearer token sent without TLS can be read by whoever answers: refuse when `source` listed any address
    that is not this machine's."""
    remote = [a for a in addresses if not is_loopback(split_host_port(a)[0])]
    if remote:
        raise ConfigError(f"refusing to send the admin token in plaintext to {shown(remote)} (listed by {source}): "
                          f"without TLS only loopback addresses get it; give --tls-ca, or pass --admin-insecure")


def from_dns(name_port: str) -> list[str]:
    name, port = split_host_port(name_port)
    try:
        infos = socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ConfigError(f"cannot resolve {name}: {err}") from None
    return sorted({join_host_port(info[4][0], port) for info in infos})


@dataclass(frozen=True)
class KubeApi:
    server: str
    token: Optional[str] = None
    ssl_context: Optional[ssl.SSLContext] = None
    namespace: str = "default"

    def get(self, path: str) -> Optional[dict]:
        """The JSON at `path`, or None for a 404 (a kind the API server does not serve)."""
        request = urllib.request.Request(self.server.rstrip("/") + path, headers={"Accept": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, context=self.ssl_context, timeout=15) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise ConfigError(f"Kubernetes API {path}: HTTP {err.code} {err.read()[:300]!r}") from None
        except urllib.error.URLError as err:
            raise ConfigError(f"Kubernetes API {self.server}: {err.reason}") from None


def kube_api(kubeconfig: Optional[Path] = None) -> KubeApi:
    """In-cluster credentials when running in a pod (and no kubeconfig is named), else the kubeconfig's."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and SERVICE_ACCOUNT.is_dir():
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        return KubeApi(http_url(host, int(port), "https"), (SERVICE_ACCOUNT / "token").read_text().strip(),
                       context, (SERVICE_ACCOUNT / "namespace").read_text().strip())
    return from_kubeconfig(kubeconfig or Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config")))


def from_kubeconfig(path: Path) -> KubeApi:
    """The API server, credentials and namespace of the kubeconfig's current context; a file that is not one this
    client reads is a ConfigError naming the file and the kind of problem, never its contents (it holds secrets)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no kubeconfig at {path} (and not running in a cluster)")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_KUBECONFIG_BYTES + 1)
        if len(raw) > MAX_KUBECONFIG_BYTES:
            raise ConfigError(f"kubeconfig {path} is over {MAX_KUBECONFIG_BYTES} bytes")
        return current_context_api(yaml.safe_load(raw.decode("utf-8")), path)
    except OSError as err:  # a credential file it names; a certificate ssl refuses (ssl.SSLError is one)
        raise ConfigError(f"kubeconfig {path}: {shown(str(err))}") from None
    except KeyError as err:
        raise ConfigError(f"kubeconfig {path} lacks the field {shown(err.args[0] if err.args else None)} of its "
                          "current context") from None
    except (ValueError, yaml.YAMLError, TypeError, AttributeError) as err:  # not UTF-8 YAML of a kubeconfig's shape
        raise ConfigError(f"kubeconfig {path} is not a kubeconfig this client reads ({type(err).__name__})") from None


def current_context_api(config: dict, path: Path) -> KubeApi:
    def by_name(kind: str, name) -> Optional[dict]:  # kind "contexts": the "context" of the entry named `name`
        return next((entry[kind[:-1]] for entry in config.get(kind) or [] if entry["name"] == name), None)

    context = by_name("contexts", config.get("current-context"))
    if context is None:
        raise ConfigError(f"kubeconfig {path} has no current-context")
    cluster, user = by_name("clusters", context["cluster"]), by_name("users", context.get("user")) or {}
    server = cluster["server"]
    ssl_context = None
    if server.startswith("https"):
        ssl_context = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname, ssl_context.verify_mode = False, ssl.CERT_NONE
        ca = material(cluster, "certificate-authority")
        if ca:
            ssl_context.load_verify_locations(cadata=ca.decode())
        cert, key = material(user, "client-certificate"), material(user, "client-key")
        if cert and key:
            with tempfile.TemporaryDirectory() as tmp:  # ssl loads a client certificate from files only
                (Path(tmp) / "c").write_bytes(cert)
                (Path(tmp) / "k").write_bytes(key)
                ssl_context.load_cert_chain(Path(tmp) / "c", Path(tmp) / "k")
    return KubeApi(server, user.get("token"), ssl_context, context.get("namespace", "default"))


def material(entry: dict, name: str) -> Optional[bytes]:
    """A kubeconfig credential given inline (`name-data`, base64) or as a file (`name`)."""
    if entry.get(f"{name}-data"):
        return base64.b64decode(entry[f"{name}-data"])
    return Path(entry[name]).read_bytes() if entry.get(name) else None


def from_kubernetes(service: str, port_name: str = "admin", api: Optional[KubeApi] = None) -> list[str]:
    api = api or kube_api()
    namespace, _, name = service.rpartition("/")
    namespace = namespace or api.namespace
    selector = urllib.parse.urlencode({"labelSelector": f"kubernetes.io/service-name={name}"})
    for version in ("v1", "v1beta1"):
        slices = api.get(f"/apis/discovery.k8s.io/{version}/namespaces/{namespace}/endpointslices?{selector}")
        if slices is not None:
            return slice_addresses(slices, port_name)
    endpoints = api.get(f"/api/v1/namespaces/{namespace}/endpoints/{name}")
    if endpoints is None:
        raise ConfigError(f"service {namespace}/{name} has no Endpoints")
    return endpoint_addresses(endpoints, port_name)


def slice_addresses(slices: dict, port_name: str) -> list[str]:
    out = set()
    for item in slices.get("items", []):
        ports = [p["port"] for p in item.get("ports") or [] if p.get("name") == port_name]
        for endpoint in item.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready", True):
                out |= {join_host_port(a, port) for a in endpoint["addresses"] for port in ports}
    return sorted(out)


def endpoint_addresses(endpoints: dict, port_name: str) -> list[str]:
    out = set()
    for subset in endpoints.get("subsets") or []:
        ports = [p["port"] for p in subset.get("ports") or [] if p.get("name") == port_name]
        out |= {join_host_port(a["ip"], port) for a in subset.get("addresses") or [] for port in ports}
    return sorted(out)
