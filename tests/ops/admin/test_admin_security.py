"""Who may call the admin server and over what: tokens and roles, mTLS identities, the plaintext refusal,
the rate limit and the audit log, on a real gRPC server (no SGLang behind it: these checks come first)."""
import json
import subprocess
import urllib.request

import grpc
import pytest

from dspark.integration.server import free_port
from dspark.models.errors import ConfigError
from dspark.ops.admin import server
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.security import AuditLog, RateLimiter, TlsFiles, TokenBook, check_listen_address
from dspark.ops.admin.service import AdminService
from dspark.ops.cli import main

NOWHERE = SGLangBackend(f"http://127.0.0.1:{free_port()}", timeout_s=2)  # no replica: calls past auth fail


def write(folder, name, text):
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture
def book(tmp_path):
    return TokenBook.from_files([write(tmp_path, "alice", "a" * 32 + "\n")], [write(tmp_path, "grafana", "g" * 32)])


def test_tokens_name_their_caller_and_role(book):
    assert book.identify("a" * 32).name == "alice" and book.identify("a" * 32).role == "admin"
    assert book.identify("g" * 32).role == "reader"
    assert book.identify("a" * 31) is None and book.identify(None) is None


@pytest.mark.parametrize("content, problem", [("short", "at least 16"), (None, "does not exist")])
def test_bad_token_files_are_named(tmp_path, content, problem):
    path = write(tmp_path, "t", content) if content else tmp_path / "missing"
    with pytest.raises(ConfigError, match=problem):
        TokenBook.from_files([path])


def test_plaintext_off_loopback_is_refused_unless_insecure():
    check_listen_address("127.0.0.1", tls=False, insecure=False)
    check_listen_address("::1", tls=False, insecure=False)
    with pytest.raises(ConfigError, match="without TLS"):
        check_listen_address("0.0.0.0", tls=False, insecure=False)
    check_listen_address("0.0.0.0", tls=False, insecure=True)
    check_listen_address("0.0.0.0", tls=True, insecure=False)


def test_the_admin_server_command_refuses_before_listening(tmp_path, capsys, book):
    token = write(tmp_path, "ops", "o" * 32)
    args = ["admin-server", "--sglang-url", NOWHERE.url, "--admin-port", "0", "--admin-token-file", str(token)]
    assert main(args + ["--admin-host", "0.0.0.0"]) == 2
    assert "without TLS" in capsys.readouterr().err
    assert main(["admin-server", "--sglang-url", NOWHERE.url, "--admin-port", "0"]) == 2
    assert "needs credentials" in capsys.readouterr().err


def test_rate_limit_is_a_token_bucket_per_caller():
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")  # per caller
    now[0] = 0.5  # one more token after 0.5 s at 2/s
    assert limiter.allow("a") and not limiter.allow("a")


@pytest.fixture
def running(tmp_path, book):
    audit = AuditLog(tmp_path / "audit.jsonl")
    service = AdminService(NOWHERE, book, RateLimiter(0.001, 2), audit)
    admin = server.start(service, "127.0.0.1", 0, TlsFiles())
    yield admin, audit
    admin.stop()


def test_every_refused_change_is_audited_and_counted(running, tmp_path):
    admin, audit = running
    address = f"127.0.0.1:{admin.port}"
    clients = {name: AdminClient(address, Credentials(token), timeout_s=5)
               for name, token in (("anon", None), ("reader", "g" * 32), ("admin", "a" * 32))}
    codes = []
    for name in ("anon", "reader", "admin", "admin", "admin"):  # the admin's burst is 2
        with pytest.raises(grpc.RpcError) as refused:
            clients[name].update({"policy": "mtp1"})
        codes.append(refused.value.code())
    assert codes == [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                     grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE,  # past auth: no replica
                     grpc.StatusCode.RESOURCE_EXHAUSTED]
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(line["caller"], line["result"]) for line in lines] == [
        ("anonymous", "unauthenticated"), ("grafana", "permission_denied"), ("alice", "unavailable"),
        ("alice", "unavailable"), ("alice", "resource_exhausted")]
    assert all(line["peer"].startswith("ipv4:127.0.0.1") and line["rpc"] == "UpdateState" for line in lines)
    assert audit.counts[("UpdateState", "unavailable")] == 2
    port = free_port()
    metrics = server.metrics_server(audit, "127.0.0.1", port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        exposition = response.read().decode()
    metrics.shutdown()
    assert 'dspark_admin_update_attempts_total{result="unavailable",rpc="UpdateState"} 2.0' in exposition
    assert 'dspark_admin_update_attempts_total{result="unauthenticated",rpc="UpdateState"} 1.0' in exposition
    assert not clients["admin"].serving()  # health: NOT_SERVING without a replica, and open to anyone
    for client in clients.values():
        client.close()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name, subject, ext in (("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1"),
                               ("client", "/CN=ops-laptop", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(d / f"{name}.key"),
                "-out", str(d / f"{name}.csr"))
        write(d, f"{name}.ext", ext + "\n")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-days", "2", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))
    return d


def test_mtls_identifies_the_client_certificate_and_refuses_clients_without_one(pki, book, tmp_path):
    service = AdminService(NOWHERE, book, RateLimiter(1000.0, 100), AuditLog(tmp_path / "audit.jsonl"))
    admin = server.start(service, "0.0.0.0", 0, TlsFiles(pki / "server.pem", pki / "server.key", pki / "ca.pem"))
    address = f"127.0.0.1:{admin.port}"
    try:
        with_cert = AdminClient(address, Credentials(None, pki / "ca.pem", pki / "client.pem", pki / "client.key"))
        with pytest.raises(grpc.RpcError) as refused:  # a certificate makes a reader: no changes
            with_cert.update({"policy": "mtp1"})
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED and "ops-laptop" in refused.value.details()
        admin_by_cert = AdminClient(address, Credentials("a" * 32, pki / "ca.pem", pki / "client.pem",
                                                         pki / "client.key"))
        with pytest.raises(grpc.RpcError) as past_auth:  # the admin token over mTLS reaches the (absent) replica
            admin_by_cert.update({"policy": "mtp1"})
        assert past_auth.value.code() == grpc.StatusCode.UNAVAILABLE
        no_cert = AdminClient(address, Credentials("a" * 32, pki / "ca.pem"), timeout_s=5)
        with pytest.raises(grpc.RpcError) as handshake:
            no_cert.update({"policy": "mtp1"})
        assert handshake.value.code() == grpc.StatusCode.UNAVAILABLE and not no_cert.serving()
        plaintext = AdminClient(address, Credentials("a" * 32), timeout_s=5)
        assert not plaintext.serving()
        for client in (with_cert, admin_by_cert, no_cert, plaintext):
            client.close()
    finally:
        admin.stop()
