"""Restarting a replica in place: the admin sidecar asks, `dspark serve` (its parent) does it.

    sidecar   Restart RPC: sends SIGHUP to `dspark serve`
    serve     on SIGHUP: SIGTERM to SGLang, which drains (the requests in flight finish; new ones get 503 with
              Retry-After, integration/drain.py), then starts SGLang again with the settings its schedulers last
              wrote to <folder>/live-settings.json (integration/live_settings.py) as its initial state, and counts
              the start in <folder>/starts
    sidecar   answers once the count moved and the new SGLang serves its DSpark state

SGLang that exits by itself is started again the same way (`dspark serve`, paced by `CrashBudget`). The schedulers
write the live settings at start and after every change they apply, so both find the settings in force.

So a restart keeps the live settings (their version history starts again), and a client that retries its
refused or cut-off requests loses none: the Kubernetes Service or a router sends them to another replica
meanwhile, and `dspark admin restart` restarts a fleet one replica at a time. The folder is `dspark serve`'s
private per-port folder (mode 0700).
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from dspark.integration.live_settings import LIVE_SETTINGS_ENV
from dspark.models.errors import ConfigError

LIVE_SETTINGS_FILE = "live-settings.json"
STARTS_FILE = "starts"
RESTART_SIGNAL = signal.SIGHUP

DEFAULT_RESTART_TIMEOUT_S = 1800.0  # a large model's start on a GPU node: the chart's startup-probe budget
MAX_RESTART_TIMEOUT_S = 4 * 3600.0  # an unbounded wait held one of the admin server's worker threads for as long


def restart_timeout(requested: float) -> float:
    """The wait a Restart request asks for, or a ConfigError naming the bounds."""
    if requested == 0:
        return DEFAULT_RESTART_TIMEOUT_S
    if not 0 < requested <= MAX_RESTART_TIMEOUT_S:  # NaN included
        raise ConfigError(f"timeout_s must be 0 (the default, {DEFAULT_RESTART_TIMEOUT_S:g} s) or in (0, "
                          f"{MAX_RESTART_TIMEOUT_S:g}] seconds, got {requested!r}")
    return requested


@dataclass(frozen=True)
class RestartChannel:
    folder: Path
    supervisor_pid: Optional[int] = None  # the sidecar's: the `dspark serve` that started it

    # ------------------------------------------------------------ the sidecar's side

    def request(self) -> None:
        """Ask the supervisor to restart SGLang with its live settings."""
        try:
            os.kill(self.supervisor_pid, RESTART_SIGNAL)
        except ProcessLookupError:
            raise ConfigError(f"the supervising `dspark serve` (pid {self.supervisor_pid}) is gone") from None

    def starts(self) -> int:
        """How many times the supervisor has started SGLang (0 before its first start)."""
        try:
            return int((self.folder / STARTS_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return 0

    # -------------------------------------------------------- the supervisor's side

    def live_settings(self) -> Optional[dict]:
        """The settings SGLang's schedulers last applied (None: none written, or unreadable)."""
        try:
            return json.loads((self.folder / LIVE_SETTINGS_FILE).read_text())
        except (OSError, ValueError):
            return None

    def live_settings_env(self) -> dict[str, str]:
        return {LIVE_SETTINGS_ENV: str(self.folder / LIVE_SETTINGS_FILE)}

    def record_start(self) -> int:
        count = self.starts() + 1
        (self.folder / STARTS_FILE).write_text(str(count))
        return count

    def reset(self) -> None:
        """A fresh `dspark serve` start: no live settings from an earlier one, no starts counted."""
        for name in (STARTS_FILE, LIVE_SETTINGS_FILE):
            (self.folder / name).unlink(missing_ok=True)


@dataclass
class CrashBudget:
    """How `dspark serve` paces starting SGLang again after it exited by itself: each restart waits `first_s`,
    doubled for every other restart within `window_s`, at most `longest_s`; past `limit` restarts within the
    window it gives up, so that a crash loop ends in a non-zero exit Kubernetes can see."""
    limit: int
    window_s: float
    first_s: float
    longest_s: float
    clock: object = time.monotonic
    restarts: list = field(default_factory=list)  # when each restart happened
    total: int = 0

    def next_delay(self) -> Optional[float]:
        """Seconds to wait before the next restart, counting it; None: give up."""
        now = self.clock()
        self.restarts = [t for t in self.restarts if now - t < self.window_s]
        if len(self.restarts) >= self.limit:
            return None
        delay = min(self.longest_s, self.first_s * 2 ** len(self.restarts))
        self.restarts.append(now)
        self.total += 1
        return delay
