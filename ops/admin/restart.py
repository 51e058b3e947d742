"""Restarting a replica in place: the admin sidecar asks, `dspark serve` (its parent) does it.

    sidecar   Restart RPC: writes the replica's live settings to <folder>/restart-settings.json and sends
              SIGHUP to `dspark serve`
    serve     on SIGHUP: SIGTERM to SGLang, which drains (the requests in flight finish; new ones get 503 with
              Retry-After, integration/drain.py), then starts SGLang again with those settings as its initial
              state, and counts the start in <folder>/starts
    sidecar   answers once the count moved and the new SGLang serves its DSpark state

So a restart keeps the live settings (their version history starts again), and a client that retries its
refused or cut-off requests loses none: the Kubernetes Service or a router sends them to another replica
meanwhile, and `dspark admin restart` restarts a fleet one replica at a time. The folder is `dspark serve`'s
private per-port folder (mode 0700).
"""
from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dspark.models.errors import ConfigError

SETTINGS_FILE = "restart-settings.json"
STARTS_FILE = "starts"
RESTART_SIGNAL = signal.SIGHUP


@dataclass(frozen=True)
class RestartChannel:
    folder: Path
    supervisor_pid: Optional[int] = None  # the sidecar's: the `dspark serve` that started it

    # ------------------------------------------------------------ the sidecar's side

    def request(self, settings: dict) -> None:
        """Ask the supervisor to restart SGLang with `settings` as its initial state."""
        path = self.folder / SETTINGS_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(settings))
        temporary.replace(path)  # the supervisor never reads half a file
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

    def take_settings(self) -> Optional[dict]:
        """The settings a restart asked for (None: none asked); consumed."""
        path = self.folder / SETTINGS_FILE
        try:
            settings = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        path.unlink()
        return settings

    def record_start(self) -> int:
        count = self.starts() + 1
        (self.folder / STARTS_FILE).write_text(str(count))
        return count

    def reset(self) -> None:
        """A fresh `dspark serve` start: no restart pending, no starts counted."""
        for name in (SETTINGS_FILE, STARTS_FILE):
            (self.folder / name).unlink(missing_ok=True)
