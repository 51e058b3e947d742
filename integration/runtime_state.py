"""The one live-tunable state of dspark's verify planner inside SGLang: versioned, validated whole, undoable.

The state is a `VerifySettings` (models/decoding/settings.py: every setting's name, default, range and
validation). The initial state comes from the JSON in `DSPARK_RUNTIME_STATE` (`dspark serve` writes it from
its flags); SGLang's `--speculative-dspark-sps-table-path` fills `sps_table` when the JSON has none.

An update is the value of the `dspark` key of `/set_internal_state {"server_args": {"dspark": ...}}`, in one
of two forms:

    {"policy": "threshold", "threshold": 0.4}                      settings to merge (caller "http")
    {"set": {...settings}, "expected_version": 3, "caller": "alice", "validate_only": false}
    {"rollback_to": "previous" | <version>, "expected_version": 3, "caller": "alice"}

The merged state is validated whole against the drafter's gamma and swapped in between rounds (the scheduler
reads it at the start of each round), so no round sees half an update. A refused update changes nothing; its
reason is kept as `last_rejection`. Each accepted change gets the next version (no gaps; validate_only
changes nothing) and a history entry (who, when, what), the last HISTORY of which are kept. `expected_version`
makes an update conditional: on any other current version it is refused as a `VersionConflict`. A rollback
installs the state of an earlier version (default: the one before the current) as a new version.

An update's values cannot take the scheduler down: an `sps_table` it names must lie under the SPS directories
or be the table the server started with, checked before the file is opened (models/decoding/sps_paths.py);
reading or parsing a table fails as a ConfigError that never quotes the file; `caller` is at most MAX_CALLER
characters; every value a refusal echoes is clipped (models/errors.py `shown`). `check` reads the table once,
and `install` swaps in what it compiled, so applying a checked update opens no file.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Union

import torch

from dspark.kernels.sps import SpsTable
from dspark.models.decoding.settings import SGLANG_POLICY, VerifySettings
from dspark.models.decoding.sps_paths import confined_sps_path
from dspark.models.decoding.sps_profile import load_sps
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError, shown

ENV_VAR = "DSPARK_RUNTIME_STATE"
HISTORY = 32
ENVELOPE_KEYS = ("set", "rollback_to", "expected_version", "caller", "validate_only")
PREVIOUS = "previous"
MAX_CALLER = 128  # characters: a token's name, "http", "auto-refit"


class VersionConflict(ConfigError):
    """An update made against a version that is no longer the current one."""


@dataclass(frozen=True)
class Planner:
    """A validated state, compiled into what a round needs."""
    state: VerifySettings
    policy: Optional[VerifyLengthPolicy]  # None: SGLang's built-in planner
    sts_temperatures: Optional[torch.Tensor]


@dataclass(frozen=True)
class Update:
    changes: Optional[dict]  # settings to merge; None for a rollback
    rollback_to: Union[int, str, None] = None
    expected_version: Optional[int] = None
    caller: str = "http"
    validate_only: bool = False
    envelope: bool = False  # the envelope form, which answers with what it did


@dataclass(frozen=True)
class Change:
    """One accepted version: what it set, who set it and when."""
    version: int
    state: VerifySettings
    caller: str
    time: float  # unix seconds
    action: str  # initial | update | rollback

    def to_dict(self) -> dict:
        return {"version": self.version, "caller": self.caller, "time": self.time, "action": self.action,
                "state": self.state.to_dict()}


def compile_state(state: VerifySettings, gamma: int) -> Planner:
    """Check the state against the drafter's gamma and load its SPS table; a ConfigError names the problem."""
    state.check_gamma(gamma)
    sts = torch.tensor(state.sts_temperatures) if state.sts_temperatures is not None else None
    table: Optional[SpsTable] = load_sps(state.sps_table) if state.sps_table is not None else None
    if state.policy == SGLANG_POLICY:
        return Planner(state, None, sts)
    return Planner(state, VerifyLengthPolicy(state, table), sts)


def is_envelope(value: Any) -> bool:
    """Whether an update is the envelope form (set / rollback_to) rather than bare settings."""
    return isinstance(value, dict) and bool({"set", "rollback_to"} & set(value))


def parse_update(value: Any) -> Update:
    """Either form of the module docstring; a ConfigError names what is malformed."""
    if not isinstance(value, dict):
        raise ConfigError(f"a dspark update must be a JSON object, got {type(value).__name__}")
    if not is_envelope(value):
        return Update(changes=value)
    unknown = sorted(set(value) - set(ENVELOPE_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {shown(unknown)} in a dspark update; known: {list(ENVELOPE_KEYS)}")
    if ("set" in value) == ("rollback_to" in value):
        raise ConfigError("a dspark update has either `set` or `rollback_to`, not both")
    expected, caller = value.get("expected_version"), value.get("caller", "http")
    rollback_to = value.get("rollback_to")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
        raise ConfigError(f"expected_version must be an integer or null, got {shown(expected)}")
    if not isinstance(caller, str) or not isinstance(value.get("validate_only", False), bool):
        raise ConfigError("caller must be a string and validate_only a boolean")
    if len(caller) > MAX_CALLER:
        raise ConfigError(f"caller must be at most {MAX_CALLER} characters, got {shown(caller)}")
    if "rollback_to" in value and rollback_to != PREVIOUS and (isinstance(rollback_to, bool)
                                                             or not isinstance(rollback_to, int)):
        raise ConfigError(f"rollback_to must be a version number or {PREVIOUS!r}, got {shown(rollback_to)}")
    return Update(value.get("set"), rollback_to if "rollback_to" in value else None, expected, caller,
                  value.get("validate_only", False), envelope=True)


class RuntimeStateStore:
    """The process's current planner, its version and its recent history; `update` is all-or-nothing."""

    def __init__(self, initial: VerifySettings, gamma: int, clock=time.time,
                 on_change: Optional[Callable[[VerifySettings], None]] = None):
        """`on_change(state)`: told the state at start and after every applied change, whoever made it (an admin
        update, a rollback, an automatic refit)."""
        self.gamma, self.clock, self.on_change = gamma, clock, on_change
        self.planner = compile_state(initial, gamma)
        self.started_with_table = initial.sps_table  # the one table a live update may name outside the SPS dirs
        self.version = 0
        self.history: deque[Change] = deque([Change(0, initial, "startup", clock(), "initial")], maxlen=HISTORY)
        self.last_rejection: Optional[str] = None
        if on_change is not None:
            on_change(initial)

    @classmethod
    def from_environment(cls, gamma: int, sps_table: Optional[str],
                         on_change: Optional[Callable[[VerifySettings], None]] = None) -> "RuntimeStateStore":
        return cls(cls.initial_settings(sps_table), gamma, on_change=on_change)

    @staticmethod
    def initial_settings(sps_table: Optional[str]) -> VerifySettings:
        """The state `dspark serve` handed over (ENV_VAR), with `sps_table` when it names none (not compiled)."""
        state = VerifySettings.from_dict(json.loads(os.environ.get(ENV_VAR) or "{}"))
        return replace(state, sps_table=sps_table) if state.sps_table is None and sps_table else state

    def check(self, value: Any) -> tuple[Planner, Update]:
        """The planner `value` would give and the parsed update, or a ConfigError (remembered as last_rejection)."""
        try:
            update = parse_update(value)
            if update.expected_version is not None and update.expected_version != self.version:
                raise VersionConflict(f"expected version {update.expected_version}, the current version is "
                                      f"{self.version}: read the state again and redo the change")
            state = (self.rolled_back_state(update.rollback_to) if update.changes is None
                     else VerifySettings.from_dict(update.changes, self.planner.state))
            if update.changes is not None and update.changes.get("sps_table") is not None:
                confined_sps_path(state.sps_table, self.started_with_table)
            return compile_state(state, self.gamma), update
        except ConfigError as err:
            self.last_rejection = f"dspark runtime state update rejected: {err}"
            raise type(err)(self.last_rejection) from None

    def rolled_back_state(self, to: Union[int, str]) -> VerifySettings:
        kept = [change.version for change in self.history]
        if to == PREVIOUS:
            if len(self.history) < 2:
                raise ConfigError(f"there is no version before {self.version} to roll back to")
            return self.history[-2].state
        for change in self.history:
            if change.version == to:
                return change.state
        raise ConfigError(f"version {to} is not in the kept history (versions {kept[0]}..{kept[-1]})")

    def update(self, value: Any) -> dict:
        """Apply an update (either form): what `install` answers."""
        return self.install(*self.check(value))

    def install(self, planner: Planner, update: Update) -> dict:
        """Apply what `check` returned (as `update`); nothing here can fail. {"applied", "version", "state"
        (validate_only: the state it would give), "gamma"} and what it replaced, "version_before" and
        "state_before": taken in the same step, so an audit of the change is exact whoever else changes the state
        (another admin caller, the HTTP side door, an automatic refit)."""
        replaced = {"version_before": self.version, "state_before": self.planner.state.to_dict()}
        self.last_rejection = None
        if not update.validate_only:
            self.planner, self.version = planner, self.version + 1
            action = "update" if update.changes is not None else "rollback"
            self.history.append(Change(self.version, planner.state, update.caller, self.clock(), action))
            if self.on_change is not None:
                self.on_change(planner.state)
        return {"applied": not update.validate_only, "version": self.version, "state": planner.state.to_dict(),
                "gamma": self.gamma, **replaced}

    def report(self) -> dict:
        return {**self.planner.state.to_dict(), "gamma": self.gamma, "version": self.version,
                "last_rejection": self.last_rejection, "history": [c.to_dict() for c in self.history]}
