"""The audit log under concurrent writers: 50 conflicting UpdateState calls at once from two admin tokens, on a real
gRPC server over a real runtime state store (store_replica.py), leave lines whose versions chain and whose diffs
are exact. The same race on a real replica is in tests/integration/test_admin_grpc.py."""
import json
import threading

import pytest

from dspark.models.decoding.settings import VerifySettings
from dspark.ops.admin import server
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.security import AuditLog, RateLimiter, TlsFiles, TokenBook
from dspark.ops.admin.service import AdminService

from tests.ops.admin.hostile import WRITERS, check_chain, threshold_of
from tests.ops.admin.store_replica import StoreReplica

TOKENS = {"alice": "a" * 32, "bob": "b" * 32}


@pytest.fixture
def replica():
    replica = StoreReplica()
    yield replica
    replica.stop()


def test_50_concurrent_conflicting_updates_leave_an_audit_log_that_chains_exactly(replica, tmp_path):
    """Each call read the state, then updated it, without holding a lock across both: 49 of 50 lines had the wrong
    version_before and 30 the wrong diff."""
    for name, token in TOKENS.items():
        (tmp_path / name).write_text(token)
    service = AdminService(replica.backend, TokenBook.from_files([tmp_path / name for name in TOKENS]),
                           RateLimiter(1000.0, 1000), AuditLog(tmp_path / "audit.jsonl"))
    running = server.start(service, "127.0.0.1", 0, TlsFiles())
    names = list(TOKENS)
    clients = {name: AdminClient(f"127.0.0.1:{running.port}", Credentials(TOKENS[name]), timeout_s=60)
               for name in names}
    start, failures = threading.Barrier(WRITERS), []

    def write(writer: int) -> None:
        start.wait()
        try:  # every fifth only validates: its line must name the version it was checked against
            clients[names[writer % 2]].update({"policy": "threshold", "threshold": threshold_of(writer)},
                                              validate_only=writer % 5 == 4)
        except Exception as err:
            failures.append(err)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(WRITERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for client in clients.values():
            client.close()
        running.stop()
    assert failures == []
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert len(lines) == WRITERS and {line["rpc"] for line in lines} == {"UpdateState"}
    callers = {threshold_of(writer): names[writer % 2] for writer in range(WRITERS)}
    applied = check_chain(lines, VerifySettings(policy="fixed").to_dict(), 0, callers)
    assert applied == WRITERS - WRITERS // 5 == replica.store.version
    last = [line for line in lines if line["result"] == "applied"][-1]
    assert replica.store.planner.state.threshold == last["diff"]["threshold"][1]
