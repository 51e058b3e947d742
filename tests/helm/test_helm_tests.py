"""The gRPC `helm test` pod's script, run here against a real admin server (dspark.ops.admin, no SGLang behind
it: health answers NOT_SERVING) under admin TLS with client certificates: it dials the admin Service's DNS name,
which the server certificate names (no IP SAN), and presents the client certificate it mounts. Only what cannot
exist outside a pod is translated: the Service's name to localhost (the certificate names both) and the mounted
Secrets' paths to files here."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dspark.integration.server import free_port
from dspark.ops.admin import server
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.security import AuditLog, RateLimiter, TlsFiles, TokenBook
from dspark.ops.admin.service import AdminService

from tests.helm.chart_tools import find
from tests.pki import make_pki

SERVICE = "dspark-admin.dspark.svc"  # the chart's admin Service for release dspark in namespace dspark


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for the admin Service's DNS name (and localhost), a client certificate."""
    return make_pki(tmp_path_factory.mktemp("pki"), "/CN=dspark-admin", f"DNS:{SERVICE},DNS:localhost")


@pytest.fixture(scope="module")
def admin_port(pki, tmp_path_factory):
    folder = tmp_path_factory.mktemp("admin")
    (folder / "ops").write_text("o" * 32)
    book = TokenBook.from_files([folder / "ops"], [])
    nowhere = SGLangBackend(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    service = AdminService(nowhere, book, RateLimiter(10.0, 10), AuditLog(folder / "audit.jsonl"))
    admin = server.start(service, "127.0.0.1", 0, TlsFiles(pki / "server.pem", pki / "server.key", pki / "ca.pem"))
    yield admin.port
    admin.stop()


def run_test_pod(render, pki, port: int, *flags: str) -> subprocess.CompletedProcess:
    docs = render("--set", f"admin.port={port}", "--set", "admin.tls.secretName=admin-tls", *flags)
    (container,) = find(docs, "Pod", "-test-grpc")["spec"]["containers"]
    script = container["args"][0]
    assert f'"{SERVICE}:{port}"' in script  # the Service's name, never a pod IP
    for inside, here in (("/etc/dspark/admin-tls/ca.crt", pki / "ca.pem"),
                         ("/etc/dspark/admin-client/tls.crt", pki / "client.pem"),
                         ("/etc/dspark/admin-client/tls.key", pki / "client.key")):
        script = script.replace(inside, str(here))
    script = script.replace(SERVICE, "localhost")
    return subprocess.run([sys.executable, "-c", script], text=True, capture_output=True, timeout=60)


def test_under_mtls_the_test_pod_reaches_the_admin_api_by_its_service_name(render, pki, admin_port):
    out = run_test_pod(render, pki, admin_port, "--set", "admin.tls.requireClientCert=true")
    # an answer over mTLS: NOT_SERVING, since no SGLang is behind this admin server (the pod then fails the test)
    assert out.stdout.split() == [f"localhost:{admin_port}", "NOT_SERVING"] and out.returncode == 1, out.stderr


def test_without_the_client_certificate_the_handshake_is_refused(render, pki, admin_port):
    out = run_test_pod(render, pki, admin_port)  # server-only TLS rendered: no client certificate sent
    assert out.returncode != 0 and out.stdout == "" and "StatusCode.UNAVAILABLE" in out.stderr


def test_the_client_certificate_comes_from_its_own_secret_when_named(render):
    flags = ("--set", "admin.tls.secretName=admin-tls", "--set", "admin.tls.requireClientCert=true")
    pod = find(render(*flags, "--set", "helmTests.adminClientSecret=ops-client"), "Pod", "-test-grpc")["spec"]
    assert {"name": "admin-client", "secret": {"secretName": "ops-client"}} in pod["volumes"]
    fallback = find(render(*flags), "Pod", "-test-grpc")["spec"]
    assert {"name": "admin-client", "secret": {"secretName": "admin-tls"}} in fallback["volumes"]
