"""Who may call the admin server and over what: tokens and roles, mTLS identities, the plaintext refusal,
the rate limit and the audit log's bounds, on a real gRPC server (no SGLang behind it: these checks come
first); WatchState's bounds and admission; the sidecar process stopping within its bound. The 32-stream attack
on a sidecar of a real replica is in tests/integration/test_admin_grpc.py."""
import hashlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from dspark.integration.server import free_port
from dspark.models.errors import ConfigError
from dspark.ops.admin import server
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.security import QUIET_S, AuditLog, RateLimiter, TlsFiles, TokenBook, check_listen_address
from dspark.ops.admin.server import STOP_GRACE_S
from dspark.ops.admin.service import AdminService
from dspark.ops.admin.streams import Streams, StreamsFull
from dspark.ops.cli import main
from dspark.ops.admin.sidecar import stop_sidecar
from dspark.ops.commands.admin_server import EXIT_DEADLINE_S

from tests.pki import make_pki

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


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate (tests/pki.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"), "/CN=127.0.0.1", "IP:127.0.0.1")


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


def test_token_names_longer_than_a_caller_may_be_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="at most 128 characters"):
        TokenBook.from_files([write(tmp_path, "n" * 129, "a" * 32)])


# ------------------------------------------------------------------------------------------- the audit log


def lines_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_refusals_before_the_rate_limit_are_folded_into_one_line_a_second(tmp_path):
    now = [0.0]
    audit = AuditLog(tmp_path / "audit.jsonl", clock=lambda: now[0])
    refusal = dict(rpc="UpdateState", caller="anonymous", result="unauthenticated", detail="no token")
    for i in range(200):
        now[0] = i * 0.004  # 200 calls in 0.8 s
        audit.record(**refusal, peer=f"ipv4:10.0.0.{i % 7}:{40000 + i}")
    audit.record(**refusal, peer="ipv6:[::1]:5000")  # another peer kind: its own line
    now[0] = 1.5
    audit.record(**refusal, peer="ipv4:10.0.0.1:1")
    audit.record(rpc="UpdateState", caller="alice", peer="ipv4:10.0.0.1:2", result="applied", before={}, after={})
    lines = lines_of(tmp_path / "audit.jsonl")
    assert [(line["peer"].split(":")[0], line["result"], line.get("suppressed")) for line in lines] == [
        ("ipv4", "unauthenticated", 0), ("ipv6", "unauthenticated", 0), ("ipv4", "unauthenticated", 199),
        ("ipv4", "applied", None)]  # accepted changes are never folded
    assert audit.counts[("UpdateState", "unauthenticated")] == 202  # the metrics count every one


def test_200_unauthenticated_calls_write_a_few_lines_not_200(running, tmp_path):
    admin, audit = running
    anonymous = AdminClient(f"127.0.0.1:{admin.port}", Credentials(None), timeout_s=5)
    began = time.monotonic()
    for _ in range(200):
        with pytest.raises(grpc.RpcError):
            anonymous.update({"policy": "mtp1"})
    seconds = time.monotonic() - began
    anonymous.close()
    lines = lines_of(tmp_path / "audit.jsonl")
    assert 1 <= len(lines) <= 1 + seconds / QUIET_S and audit.counts[("UpdateState", "unauthenticated")] == 200


def test_an_audit_line_stays_a_few_kilobytes_with_the_hash_of_what_it_clips(tmp_path):
    audit = AuditLog(tmp_path / "audit.jsonl")
    detail, caller = "é" * 1_000_000, "c" * 1_000_000
    audit.record(rpc="UpdateState", caller=caller, peer="ipv4:127.0.0.1:1", result="invalid_argument",
                 before={"sps_table": "a"}, after={"sps_table": "/" + "b" * 1_000_000}, detail=detail)
    text = (tmp_path / "audit.jsonl").read_text()
    line = json.loads(text)
    assert len(text.encode()) < 5000
    assert line["detail"].endswith(f"... (1000000 chars, sha256:{hashlib.sha256(detail.encode()).hexdigest()})")
    assert line["caller"].startswith("cccc") and "sha256:" in line["caller"] and "sha256:" in line["diff"]


def test_the_audit_log_rotates_by_size_keeping_n_files(tmp_path):
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, max_bytes=2000, keep=2)
    for version in range(60):
        audit.record(rpc="UpdateState", caller="alice", peer="ipv4:127.0.0.1:1", result="applied", before={},
                     after={}, version_before=version, version_after=version + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size <= 2000 for p in tmp_path.iterdir())
    newest, older, oldest = (lines_of(tmp_path / n) for n in ("audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"))
    assert newest[-1]["version_before"] == 59 and older[-1]["version_before"] + 1 == newest[0]["version_before"]
    assert oldest[-1]["version_before"] + 1 == older[0]["version_before"] and oldest[0]["version_before"] > 0


def test_the_audit_flags_reach_the_sidecar_and_are_bounded(capsys, book, tmp_path):
    token = write(tmp_path, "ops", "o" * 32)
    base = ["admin-server", "--sglang-url", NOWHERE.url, "--admin-port", "0", "--admin-token-file", str(token)]
    assert main(base + ["--admin-audit-max-bytes", "100"]) == 2
    assert "--admin-audit-max-bytes must be >= 65536, got 100" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--admin-audit-keep", str(10**12)])
    assert "argument --admin-audit-keep: must be in [0, 1000], got 1000000000000" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--admin-update-rate", "nan"])
    assert "argument --admin-update-rate: must be a finite number, got 'nan'" in capsys.readouterr().err


# -------------------------------------------------------------------------------------- WatchState streams


@pytest.mark.parametrize("interval", [1e7, 3600.5, 0.05, 1e-9, -1.0, float("nan")])
def test_watch_intervals_outside_the_bounds_are_refused_naming_them(running, interval):
    admin, _ = running
    reader = AdminClient(f"127.0.0.1:{admin.port}", Credentials("g" * 32), timeout_s=5)
    with pytest.raises(grpc.RpcError) as refused:
        next(reader.watch(interval_s=interval, timeout_s=5))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"interval_s must be 0 (the default, 1 s) or in [0.1, 3600] seconds, got " \
                                      f"{interval!r}"
    with pytest.raises(grpc.RpcError) as past_the_check:  # 0 (unset) and the bounds themselves pass
        next(reader.watch(interval_s=3600.0, timeout_s=5))
    assert past_the_check.value.code() == grpc.StatusCode.UNAVAILABLE  # no replica behind this server
    reader.close()


def test_streams_are_admitted_per_caller_and_in_all_and_woken_on_stop():
    streams = Streams(per_caller=2, total=3)
    a1, a2 = streams.admit("a"), streams.admit("a")
    with pytest.raises(StreamsFull, match="limited to 2 per caller; this caller has 2 open"):
        streams.admit("a")
    b1 = streams.admit("b")
    with pytest.raises(StreamsFull, match="limited to 3 per admin server; 3 are open"):
        streams.admit("c")
    streams.release(a1)
    streams.release(a1)  # a second release changes nothing
    c1 = streams.admit("c")
    assert not any(slot.wake.is_set() for slot in (a2, b1, c1))
    streams.close_all()
    assert all(slot.wake.is_set() for slot in (a2, b1, c1))
    with pytest.raises(StreamsFull, match="stopping"):
        streams.admit("d")


# ----------------------------------------------------------------------------------- stopping the sidecar


def hung_replica() -> socket.socket:
    """A port that takes connections and never answers: every backend call waits out its timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    return listener


def launch_sidecar(tmp_path, replica_port: int, name: str) -> subprocess.Popen:
    token = write(tmp_path, f"ops-{name}", "o" * 32)
    return subprocess.Popen([sys.executable, "-m", "dspark.ops.cli", "admin-server", "--sglang-url",
                             f"http://127.0.0.1:{replica_port}", "--admin-port", "0", "--admin-token-file", str(token),
                             "--admin-audit-log", str(tmp_path / f"audit-{name}.jsonl")],
                            stdout=subprocess.PIPE, text=True)


def connect(process: subprocess.Popen) -> AdminClient:
    """A client of a launched sidecar, once it listens (it prints where)."""
    port = int(process.stdout.readline().split(" on ")[1].split(" for ")[0].rsplit(":", 1)[1])
    return AdminClient(f"127.0.0.1:{port}", Credentials("o" * 32), timeout_s=60)


@pytest.mark.slow  # two sidecar processes start (most of its 20 s on 2 cores)
def test_sigterm_stops_the_sidecar_within_its_bound_even_with_a_call_stuck_and_a_second_one_at_once(tmp_path):
    listener = hung_replica()
    patient, hurried = (launch_sidecar(tmp_path, listener.getsockname()[1], n) for n in ("patient", "hurried"))
    clients = [connect(patient), connect(hurried)]
    streams = [c.watch(interval_s=3600.0, timeout_s=60) for c in clients]
    time.sleep(1.0)  # both streams are in their first /server_info read, which never comes back
    began = time.monotonic()
    hurried.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    hurried.send_signal(signal.SIGTERM)
    assert hurried.wait(timeout=5) == 128 + signal.SIGTERM and time.monotonic() - began < 2.0
    began = time.monotonic()
    assert stop_sidecar(patient) == 0  # SIGTERM alone: the grace, then the exit deadline, not the 30 s call
    assert time.monotonic() - began < STOP_GRACE_S + EXIT_DEADLINE_S + 2.0
    for stream, client in zip(streams, clients):
        stream.cancel()
        client.close()
    listener.close()


def test_stop_sidecar_kills_what_ignores_sigterm_after_its_bound():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    began = time.monotonic()
    assert stop_sidecar(stubborn, timeout_s=1.0) == -signal.SIGKILL and time.monotonic() - began < 3.0
