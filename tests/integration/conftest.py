"""SGLang servers started here run as `dspark serve` runs them: without the TRITON_INTERPRET=1 that
tests/conftest.py sets for the session on CPU machines (subprocesses inherit the environment)."""
import pytest


@pytest.fixture(autouse=True)
def no_triton_interpreter_for_servers(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
