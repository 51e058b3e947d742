"""SGLang servers started here run as `dspark serve` runs them: without the TRITON_INTERPRET=1 that
tests/conftest.py sets for the session on CPU machines (subprocesses inherit the environment).

The session-scoped servers are shared by every test that only reads them (sends requests, scrapes metrics, reads
state), or that changes the runtime state and sets it back (dspark_server_restored, DsparkServe.restoring): a test
that kills, restarts or drains a server, or needs flags of its own, starts its own (docs/testing.md lists them). Each
starts when a test first asks for it and stops at the end of the session."""
from collections.abc import Iterator

import pytest

from dspark.ops.otlp_sink import OtlpReceiver

from tests.integration.dspark_serve import (MAX_QUEUED_REQUESTS, MAX_SESSION_ID_CHARS, MAX_SESSIONS,
                                            SESSION_LIFETIME_S, DsparkServe)


@pytest.fixture(autouse=True)
def no_triton_interpreter_for_servers(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpReceiver]:
    """The in-process OTLP receiver dspark_server traces to (and the admin tests' replica of their own)."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def dspark_server(tmp_path_factory, otlp) -> Iterator[DsparkServe]:
    """`dspark serve` of the embedded target + DSpark with DsparkServe's defaults: policy fixed, drafting always,
    the admin sidecar, metrics on, tracing to `otlp`; every reply captured to <folder>/capture
    (test_capture_served.py)."""
    folder = tmp_path_factory.mktemp("dspark-server")
    capture = ("--capture", str(folder / "capture"), "--capture-rate", "1.0", "--capture-redact", r"secret-\d{4}")
    yield from DsparkServe.alone(folder, dspark_args=capture, otlp_endpoint=otlp.endpoint).serving()


@pytest.fixture
def dspark_server_restored(dspark_server) -> Iterator[DsparkServe]:
    """dspark_server for a test that changes its runtime state, which is set back afterwards."""
    with dspark_server.restoring():
        yield dspark_server


@pytest.fixture(scope="session")
def nospec_server(tmp_path_factory) -> Iterator[DsparkServe]:
    """The same `dspark serve` CPU recipe with --no-spec: the embedded target alone, to compare against."""
    yield from DsparkServe.alone(tmp_path_factory.mktemp("nospec-server"), no_spec=True).serving()


@pytest.fixture(scope="session")
def gate_limits_server(tmp_path_factory, otlp) -> Iterator[DsparkServe]:
    """A second replica of dspark_server's recipe (tracing to `otlp`, no capture) with request limits a test can
    reach: MAX_QUEUED_REQUESTS sub-requests in flight, MAX_SESSIONS sessions of ids up to MAX_SESSION_ID_CHARS
    characters, each closed SESSION_LIFETIME_S after it opened (test_request_gate.py, test_sessions.py). The admin
    tests' replica A (test_admin_grpc.py, which sets its runtime state back)."""
    yield from DsparkServe.alone(tmp_path_factory.mktemp("gate-limits-server"), otlp_endpoint=otlp.endpoint,
                                 dspark_args=("--max-queued-requests", str(MAX_QUEUED_REQUESTS),
                                              "--max-sessions", str(MAX_SESSIONS),
                                              "--max-session-id-chars", str(MAX_SESSION_ID_CHARS),
                                              "--max-session-lifetime-s", str(SESSION_LIFETIME_S))).serving()
