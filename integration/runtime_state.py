"""The one live-tunable state of dspark's verify planner inside SGLang, validated as a whole.

    policy              causal | lagged | threshold | fixed | mtp1 (dspark.kernels.allocate), or `sglang`
                        for SGLang's built-in planner (global argmax budget + top-k), kept for comparison
    threshold           threshold policy: the survival (or per-position confidence) cut-off
    threshold_on        survival | confidence
    min_verify_length   drafts every request verifies at least (0..gamma)
    max_verify_length   drafts any request verifies at most (null: gamma)
    budget_fraction     (0, 1] cap on the drafts verified per round, as a fraction of requests * gamma
    sps_table           path of the SPS table (SGLang's SpsCostTable JSON) that causal and lagged read
    sts_temperatures    gamma per-position STS temperatures of the confidence head (null: leave as loaded)

The initial state comes from the JSON in `DSPARK_RUNTIME_STATE` (`dspark serve` writes it from its
flags); SGLang's `--speculative-dspark-sps-table-path` fills `sps_table` when the JSON has none. At run
time `/set_internal_state {"server_args": {"dspark": {...changes}}}` merges the changes, validates the
result and swaps it in whole; the scheduler reads it at the start of each round, so a round never sees
half an update. A rejected update leaves the running state untouched and its reason is reported under
`dspark.last_rejection` in `/get_server_info`.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

import torch

from dspark.kernels.allocate import POLICIES
from dspark.kernels.sps import SpsTable, load_sps
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError

ENV_VAR = "DSPARK_RUNTIME_STATE"
SGLANG_POLICY = "sglang"
SPS_POLICIES = ("causal", "lagged")  # the policies that read the SPS table


@dataclass(frozen=True)
class RuntimeState:
    policy: str = "causal"
    threshold: Optional[float] = None
    threshold_on: str = "survival"
    min_verify_length: int = 0
    max_verify_length: Optional[int] = None
    budget_fraction: Optional[float] = None
    sps_table: Optional[str] = None
    sts_temperatures: Optional[tuple[float, ...]] = None

    @classmethod
    def from_dict(cls, raw: Any, base: Optional["RuntimeState"] = None) -> "RuntimeState":
        """`base` (default: all defaults) with the keys of `raw` replaced; unknown keys are an error."""
        if not isinstance(raw, dict):
            raise ConfigError(f"dspark runtime state must be a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown dspark runtime setting(s) {unknown}; known: {sorted(known)}")
        changes = dict(raw)
        if changes.get("sts_temperatures") is not None:
            if not isinstance(changes["sts_temperatures"], (list, tuple)):
                raise ConfigError("sts_temperatures must be a list of per-position temperatures or null")
            changes["sts_temperatures"] = tuple(changes["sts_temperatures"])
        return replace(base or cls(), **changes)

    def to_dict(self) -> dict:
        state = asdict(self)
        state["sts_temperatures"] = list(self.sts_temperatures) if self.sts_temperatures is not None else None
        return state


@dataclass(frozen=True)
class Planner:
    """A validated state, compiled into what a round needs."""
    state: RuntimeState
    policy: Optional[VerifyLengthPolicy]  # None: SGLang's built-in planner
    sts_temperatures: Optional[torch.Tensor]


def _number(name: str, value: Any, kind: type) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int)):
        raise ConfigError(f"{name} must be {'a number' if kind is float else 'an integer'} or null, got {value!r}")


def compile_state(state: RuntimeState, gamma: int) -> Planner:
    """Validate every setting against each other and the drafter's gamma; a ConfigError names the first problem."""
    if state.policy not in POLICIES + (SGLANG_POLICY,):
        raise ConfigError(f"policy must be one of {list(POLICIES + (SGLANG_POLICY,))}, got {state.policy!r}")
    for name, kind in (("threshold", float), ("min_verify_length", int), ("max_verify_length", int),
                       ("budget_fraction", float)):
        _number(name, getattr(state, name), kind)
    if not 0 <= state.min_verify_length <= gamma:
        raise ConfigError(f"min_verify_length must be in 0..{gamma} (gamma), got {state.min_verify_length}")
    if state.max_verify_length is not None and not state.min_verify_length <= state.max_verify_length <= gamma:
        raise ConfigError(f"max_verify_length must be in min_verify_length..gamma = "
                          f"{state.min_verify_length}..{gamma}, got {state.max_verify_length}")
    if state.budget_fraction is not None and not 0.0 < state.budget_fraction <= 1.0:
        raise ConfigError(f"budget_fraction must be in (0, 1] or null, got {state.budget_fraction}")
    sts = None
    if state.sts_temperatures is not None:
        sts = torch.tensor([float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else float("nan")
                            for t in state.sts_temperatures])
        if sts.numel() != gamma or not bool(torch.all(torch.isfinite(sts) & (sts > 0))):
            raise ConfigError(f"sts_temperatures must be {gamma} (gamma) finite positive numbers, "
                              f"got {list(state.sts_temperatures)}")
    table: Optional[SpsTable] = load_sps(state.sps_table) if state.sps_table is not None else None
    if state.policy == SGLANG_POLICY:
        return Planner(state, None, sts)
    if state.policy in SPS_POLICIES and table is None:
        raise ConfigError(f"policy {state.policy!r} needs an SPS table (sps_table, or "
                          f"--speculative-dspark-sps-table-path)")
    policy = VerifyLengthPolicy(state.policy, sps=table, threshold=state.threshold, threshold_on=state.threshold_on,
                                min_length=state.min_verify_length)
    return Planner(state, policy, sts)


class RuntimeStateStore:
    """The process's current planner; `update` is all-or-nothing."""

    def __init__(self, initial: RuntimeState, gamma: int):
        self.gamma = gamma
        self.planner = compile_state(initial, gamma)
        self.version = 0
        self.last_rejection: Optional[str] = None

    @classmethod
    def from_environment(cls, gamma: int, sps_table: Optional[str]) -> "RuntimeStateStore":
        raw = json.loads(os.environ.get(ENV_VAR) or "{}")
        state = RuntimeState.from_dict(raw)
        if state.sps_table is None and sps_table:
            state = replace(state, sps_table=sps_table)
        return cls(state, gamma)

    def check(self, changes: Any) -> Planner:
        """The planner `changes` would give, or a ConfigError (remembered as last_rejection)."""
        try:
            return compile_state(RuntimeState.from_dict(changes, self.planner.state), self.gamma)
        except (ConfigError, TypeError) as err:
            self.last_rejection = f"dspark runtime state update rejected: {err}"
            raise ConfigError(self.last_rejection) from None

    def update(self, changes: Any) -> RuntimeState:
        self.planner = self.check(changes)
        self.version += 1
        self.last_rejection = None
        return self.planner.state

    def report(self) -> dict:
        return {**self.planner.state.to_dict(), "gamma": self.gamma, "version": self.version,
                "last_rejection": self.last_rejection}
