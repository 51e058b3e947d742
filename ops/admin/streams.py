"""WatchState's bounds: its interval, the admission of streams, and what wakes them.

The interval is 0 (unset: DEFAULT_INTERVAL_S) or within [INTERVAL_MIN_S, INTERVAL_MAX_S]: 1e-9 s made a
stream read /server_info some 37 times a second, and 1e7 s held a worker for months.

A stream holds one of the admin server's worker threads for as long as it lasts, so readers could otherwise
take them all (32 streams of a huge interval did, and GetState, health and UpdateState then timed out). A
stream is admitted only while its caller holds fewer than PER_CALLER and the server fewer than TOTAL, which
leaves server.MAX_WORKERS - TOTAL workers to every other call; beyond, StreamsFull (RESOURCE_EXHAUSTED) names
the bound. Each admitted stream sleeps on its own Event, which the RPC's done-callback sets when the client
cancels and `close_all` sets when the server stops, so neither waits out an interval. A stream keeps its place
until its handler has returned (`release`), so the places count threads.
"""
from __future__ import annotations

import threading

from dspark.models.errors import ConfigError

DEFAULT_INTERVAL_S = 1.0
INTERVAL_MIN_S, INTERVAL_MAX_S = 0.1, 3600.0
PER_CALLER = 4
TOTAL = 16


def watch_interval(requested: float) -> float:
    """The period a WatchState request asks for, or a ConfigError naming the bounds."""
    if requested == 0:
        return DEFAULT_INTERVAL_S
    if not INTERVAL_MIN_S <= requested <= INTERVAL_MAX_S:  # NaN included
        raise ConfigError(f"interval_s must be 0 (the default, {DEFAULT_INTERVAL_S:g} s) or in "
                          f"[{INTERVAL_MIN_S:g}, {INTERVAL_MAX_S:g}] seconds, got {requested!r}")
    return requested


class StreamsFull(Exception):
    """No place for another stream: the message names the bound."""


class Slot:
    """One admitted stream; `wake` ends its sleep."""

    def __init__(self, caller: str):
        self.caller, self.wake = caller, threading.Event()


class Streams:
    def __init__(self, per_caller: int = PER_CALLER, total: int = TOTAL):
        self.per_caller, self.total = per_caller, total
        self.lock = threading.Lock()
        self.open: list[Slot] = []
        self.closed = False

    def admit(self, caller: str) -> Slot:
        with self.lock:
            mine = sum(slot.caller == caller for slot in self.open)
            if self.closed:
                raise StreamsFull("the admin server is stopping")
            if mine >= self.per_caller:
                raise StreamsFull(f"WatchState streams are limited to {self.per_caller} per caller; this caller "
                                  f"has {mine} open")
            if len(self.open) >= self.total:
                raise StreamsFull(f"WatchState streams are limited to {self.total} per admin server; "
                                  f"{len(self.open)} are open")
            slot = Slot(caller)
            self.open.append(slot)
            return slot

    def release(self, slot: Slot) -> None:
        with self.lock:
            if slot in self.open:
                self.open.remove(slot)

    def close_all(self) -> None:
        """Stopping: wake every stream and admit no more."""
        with self.lock:
            self.closed = True
            for slot in self.open:
                slot.wake.set()
