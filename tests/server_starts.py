"""Counts the SGLang servers a pytest run starts, for the line the test report prints (tests/conftest.py).

Each helper that starts one calls `record_server_start`, which appends a line to the file that
DSPARK_TEST_SERVER_STARTS names: tests/conftest.py sets it for the session under pytest's basetemp, and
subprocesses inherit it. Outside pytest (the variable unset) nothing is recorded.
"""
import os
from collections import Counter
from pathlib import Path

STARTS_ENV = "DSPARK_TEST_SERVER_STARTS"


def record_server_start(kind: str) -> None:
    """One SGLang server started, by `kind` (how: `dspark serve`, `sglang.launch_server`, ...)."""
    path = os.environ.get(STARTS_ENV)
    if path:
        with open(path, "a") as starts:
            starts.write(kind + "\n")


def server_starts(path: Path) -> Counter:
    """The starts recorded in `path`, by kind (none when no server started)."""
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()
