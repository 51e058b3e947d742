"""SGLang servers started here run as `dspark serve` runs them: without the TRITON_INTERPRET=1 that
tests/conftest.py sets for the session on CPU machines (subprocesses inherit the environment).

The session-scoped servers are shared by every test that only reads them (sends requests, scrapes metrics, reads
state): a test that kills, restarts, drains or reconfigures a server (runtime state through admin included)
starts its own. Each starts when a test first asks for it and stops at the end of the session."""
from collections.abc import Iterator

import pytest

from dspark.ops.admin.convert import message_to_settings

from tests.integration.dspark_serve import (MAX_QUEUED_REQUESTS, MAX_SESSION_ID_CHARS, MAX_SESSIONS,
                                            SESSION_LIFETIME_S, DsparkServe)


@pytest.fixture(autouse=True)
def no_triton_interpreter_for_servers(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="session")
def dspark_server(tmp_path_factory) -> Iterator[DsparkServe]:
    """`dspark serve` of the embedded target + DSpark with DsparkServe's defaults: policy fixed, drafting always,
    the admin sidecar, metrics on; every reply captured to <folder>/capture (test_capture_served.py)."""
    folder = tmp_path_factory.mktemp("dspark-server")
    capture = ("--capture", str(folder / "capture"), "--capture-rate", "1.0", "--capture-redact", r"secret-\d{4}")
    yield from DsparkServe.alone(folder, dspark_args=capture).serving()


@pytest.fixture
def dspark_server_restored(dspark_server) -> Iterator[DsparkServe]:
    """dspark_server for a test that changes its runtime state: the settings it found are set again afterwards, so
    later sharers read the server's start settings (only the state version and the counters tell it happened)."""
    client = dspark_server.client(dspark_server.admin_token)
    try:
        found = message_to_settings(client.get().settings)
        yield dspark_server
        if message_to_settings(client.get().settings) != found:
            client.update(found)
        assert message_to_settings(client.get().settings) == found, "dspark_server's settings were not restored"
    finally:
        client.close()


@pytest.fixture(scope="session")
def nospec_server(tmp_path_factory) -> Iterator[DsparkServe]:
    """The same `dspark serve` CPU recipe with --no-spec: the embedded target alone, to compare against."""
    yield from DsparkServe.alone(tmp_path_factory.mktemp("nospec-server"), no_spec=True).serving()


@pytest.fixture(scope="session")
def gate_limits_server(tmp_path_factory) -> Iterator[DsparkServe]:
    """dspark_server's `dspark serve` with request limits a test can reach: MAX_QUEUED_REQUESTS sub-requests in flight,
    MAX_SESSIONS sessions of ids up to MAX_SESSION_ID_CHARS characters, each closed SESSION_LIFETIME_S after it
    opened (tests/integration/test_request_gate.py and test_sessions.py)."""
    yield from DsparkServe.alone(tmp_path_factory.mktemp("gate-limits-server"), dspark_args=(
        "--max-queued-requests", str(MAX_QUEUED_REQUESTS), "--max-sessions", str(MAX_SESSIONS),
        "--max-session-id-chars", str(MAX_SESSION_ID_CHARS),
        "--max-session-lifetime-s", str(SESSION_LIFETIME_S))).serving()
