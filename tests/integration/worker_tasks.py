"""Tasks for a BoundedWorker in tests (integration/bounded_worker.py): module-level, so the child imports them by
name."""
import os
import time


def nothing():
    return None


def spin(state, seconds: float) -> str:
    """Holds the worker for `seconds` (far past any bound, in the test that kills it)."""
    time.sleep(seconds)
    return "finished"


def pid(state, payload) -> int:
    return os.getpid()
