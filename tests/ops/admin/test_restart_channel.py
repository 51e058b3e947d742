"""The restart hand-over between the admin sidecar and `dspark serve` (ops/admin/restart.py), the Restart RPC's
refusals on a real gRPC server with no SGLang behind it, and the rolling restart's one-at-a-time rule. The
restart itself, under load, runs on the real server in tests/integration/test_liveness_and_restarts.py."""
import json
import signal
import subprocess
import sys
import time

import grpc
import pytest

from dspark.integration.server import free_port
from dspark.models.errors import ConfigError
from dspark.ops.admin import server
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.fleet import rolling_restart
from dspark.ops.admin.restart import RestartChannel
from dspark.ops.admin.security import AuditLog, RateLimiter, TlsFiles, TokenBook
from dspark.ops.admin.service import AdminService
from dspark.ops.admin.v1 import admin_pb2 as pb
from dspark.ops.cli import main

NOWHERE = SGLangBackend(f"http://127.0.0.1:{free_port()}", timeout_s=2)
TOKEN = "r" * 32

# A stand-in supervisor: a process that writes "restart" to a file when SIGHUP arrives.
SUPERVISOR = """
import signal, sys, time
signal.signal(signal.SIGHUP, lambda *_: open(sys.argv[1], "w").write("restart"))
print("ready", flush=True)
time.sleep(60)
"""


def test_the_sidecar_signals_the_supervisor_which_reads_the_live_settings(tmp_path):
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path / "signalled")],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert supervisor.stdout.readline().strip() == "ready"
        serve_side, sidecar_side = RestartChannel(tmp_path), RestartChannel(tmp_path, supervisor.pid)
        serve_side.reset()
        assert sidecar_side.starts() == 0 and serve_side.live_settings() is None
        assert serve_side.record_start() == 1
        (tmp_path / "live-settings.json").write_text(json.dumps({"policy": "lagged", "max_verify_length": 3}))
        sidecar_side.request()
        deadline = time.monotonic() + 10
        while not (tmp_path / "signalled").exists():
            assert time.monotonic() < deadline, "the supervisor got no SIGHUP"
            time.sleep(0.05)
        assert serve_side.live_settings() == {"policy": "lagged", "max_verify_length": 3}
        assert serve_side.record_start() == 2 and sidecar_side.starts() == 2
        serve_side.reset()  # a fresh `dspark serve`: nothing from the last one
        assert sidecar_side.starts() == 0 and serve_side.live_settings() is None
    finally:
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()


def start_admin(tmp_path, restarts):
    (tmp_path / "ops").write_text(TOKEN)
    book = TokenBook.from_files([tmp_path / "ops"])
    service = AdminService(NOWHERE, book, RateLimiter(1000.0, 100), AuditLog(tmp_path / "audit.jsonl"),
                           restarts=restarts)
    return server.start(service, "127.0.0.1", 0, TlsFiles())


@pytest.mark.parametrize("supervised, code, reason", [
    (False, grpc.StatusCode.FAILED_PRECONDITION, "not started by `dspark serve`"),
    (True, grpc.StatusCode.UNAVAILABLE, "/server_info"),  # supervised, but no replica answers to read settings
])
def test_restart_refusals_name_the_problem_and_are_audited(tmp_path, supervised, code, reason):
    admin = start_admin(tmp_path, RestartChannel(tmp_path, 2**22 + 7) if supervised else None)
    client = AdminClient(f"127.0.0.1:{admin.port}", Credentials(TOKEN), timeout_s=10)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            client.restart(timeout_s=5)
        assert refused.value.code() == code and reason in refused.value.details()
        if supervised:
            audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
            assert [(a["rpc"], a["result"]) for a in audit] == [("Restart", "unavailable")]
    finally:
        client.close()
        admin.stop()


@pytest.mark.parametrize("timeout_s", [-1.0, 1e300, float("inf"), float("nan")])
def test_a_restart_wait_out_of_bounds_is_refused_and_audited(tmp_path, timeout_s):
    """An unbounded wait held one of the admin server's worker threads until the server stopped."""
    admin = start_admin(tmp_path, RestartChannel(tmp_path, 2**22 + 7))
    client = AdminClient(f"127.0.0.1:{admin.port}", Credentials(TOKEN), timeout_s=10)
    try:
        with pytest.raises(ConfigError, match="timeout_s must be 0"):  # the client refuses it by the same rule
            client.restart(timeout_s=timeout_s)
        with pytest.raises(grpc.RpcError) as refused:  # and so does the server, whoever sends it
            client.stub.Restart(pb.RestartRequest(timeout_s=timeout_s), metadata=client.metadata, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "timeout_s must be 0 (the default, 1800 s) or in (0, 14400] seconds, got" in refused.value.details()
        audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(a["rpc"], a["result"]) for a in audit] == [("Restart", "invalid_argument")]
    finally:
        client.close()
        admin.stop()


def test_the_admin_server_wants_both_supervisor_flags(tmp_path, capsys):
    (tmp_path / "ops").write_text(TOKEN)
    args = ["admin-server", "--sglang-url", NOWHERE.url, "--admin-port", "0",
            "--admin-token-file", str(tmp_path / "ops"), "--supervisor-pid", "1"]
    assert main(args) == 2
    assert "go together" in capsys.readouterr().err


class Replica:
    """An AdminClient's restart surface: serving or not, and whether its restart works."""

    def __init__(self, address, serving=True, fails=False):
        self.address, self._serving, self.fails, self.restarted = address, serving, fails, False

    def serving(self):
        return self._serving

    def restart(self, timeout_s):
        if self.fails:
            raise RuntimeError("did not come back")
        self.restarted = True
        return type("Reply", (), {"state": type("State", (), {"version": 1})(), "seconds": 2.0, "starts": 2})()


def test_a_rolling_restart_takes_one_replica_out_at_a_time_and_stops_at_a_failure():
    fleet = [Replica("a"), Replica("b", fails=True), Replica("c")]
    result = rolling_restart(fleet)
    assert [o.result for o in result.outcomes] == ["restarted", "failed", "not restarted"]
    assert not result.converged and not fleet[2].restarted
    fleet = [Replica("a"), Replica("b", serving=False)]
    result = rolling_restart(fleet)
    assert [o.result for o in result.outcomes] == ["not restarted", "not restarted"]
    assert "b not serving" in result.outcomes[0].detail and not fleet[0].restarted
    assert rolling_restart([Replica("a"), Replica("b")]).converged
