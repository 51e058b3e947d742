"""The replica the admin server controls: SGLang's HTTP API on loopback, with SGLang's admin key.

Every change goes through `/set_internal_state` with the `dspark` key's envelope form
(integration/runtime_state.py), the same path an HTTP update takes: SGLang hands it to every scheduler (each
TP rank, each DP rank), which validate it whole and swap it in between rounds. So the version, the history
and the validation live in the schedulers, and this process keeps no state of its own: a restarted admin
server sees exactly what the replica runs.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from dspark.integration.runtime_state import VersionConflict
from dspark.models.errors import ConfigError, shown


class ReplicaUnavailable(Exception):
    """The SGLang server did not answer (starting, stopped, or not serving DSpark)."""


@dataclass
class SGLangBackend:
    url: str  # http://127.0.0.1:PORT
    admin_key: Optional[str] = None
    timeout_s: float = 30.0

    def server_info(self) -> dict:
        """The first scheduler's internal state (model_path, device, dtype, ..., and `dspark`)."""
        info = self._call("GET", "/server_info")
        state = (info.get("internal_states") or [{}])[0]
        if "dspark" not in state:
            raise ReplicaUnavailable("the server runs no DSpark planner (is dspark's plugin loaded?)")
        return state

    def report(self) -> dict:
        """The dspark report of the first scheduler (all schedulers hold the same state)."""
        state = self.server_info()
        return {**state["dspark"], "last_gen_throughput": state.get("last_gen_throughput", 0.0)}

    def update(self, envelope: dict) -> dict:
        """Apply an envelope-form update; {"applied", "version", "state"}. ConfigError / VersionConflict
        name why the schedulers refused it."""
        replies = self._call("POST", "/set_internal_state", {"server_args": {"dspark": envelope}})
        if not isinstance(replies, list) or not replies or not all(isinstance(r, dict) for r in replies):
            raise ConfigError(f"the server did not apply the update: {shown(replies)}")
        return replies[0]

    def load_drafter(self, path: str) -> dict:
        """Load the drafter folder at `path` into every scheduler's draft runners (integration/drafter_swap.py);
        {"drafter", "previous", "seconds"} of the first. ConfigError names why the schedulers refused it."""
        replies = self._call("POST", "/set_internal_state", {"server_args": {"dspark_drafter": {"path": path}}})
        if not isinstance(replies, list) or not replies or not all(isinstance(r, dict) for r in replies):
            raise ConfigError(f"the server did not load the drafter: {shown(replies)}")
        return replies[0]

    def started(self) -> bool:
        """SGLang's start-up is over and its warm-up request answered (GET /ready: 503 while starting or shutting
        down)."""
        try:
            self._call("GET", "/ready")
            return True
        except (ReplicaUnavailable, ConfigError):
            return False

    def ready(self) -> bool:
        """Started, and the schedulers answer with their dspark state. SERVING any earlier let a client's requests in
        before the warm-up, and a SIGTERM then (the drain refuses the warm-up) ended SGLang with them in flight."""
        if not self.started():
            return False
        try:
            self.report()
            return True
        except (ReplicaUnavailable, ConfigError):
            return False

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
                return json.loads(body) if body else None  # GET /ready answers with an empty body
        except urllib.error.HTTPError as err:
            message = error_message(err)
            if err.code == 409:
                raise VersionConflict(message) from None
            if err.code == 400:
                raise ConfigError(message) from None
            raise ReplicaUnavailable(f"{method} {path}: HTTP {err.code}: {message}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            raise ReplicaUnavailable(f"{method} {path}: {err}") from None


def error_message(err: urllib.error.HTTPError) -> str:
    body = err.read().decode(errors="replace")
    try:
        return json.loads(body).get("message") or body
    except (json.JSONDecodeError, AttributeError):
        return body
