"""Everything dspark's plugin keeps in one SGLang process, in one object.

plugin.py creates a `SchedulerState` when SGLang registers the plugin (once per process SGLang starts: launcher,
each scheduler, detokenizer) and hands it to every hook that reads or writes it, so no module holds state of its
own. Only a scheduler process fills it: its DSpark planner's `__init__` installs the runtime state store
(planner.py); the other processes keep the empty object.

Under tensor parallelism each TP rank is a scheduler process of its own with its own `SchedulerState`; the ranks
plan alike because they hold the same store, count the same rounds and agree on wall-clock inputs
(planner.agreed), not because they share this object.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed

from dspark.integration.calibration import LiveCalibration
from dspark.integration.draft_faults import FaultInjector
from dspark.integration.drafting import ServedGate
from dspark.integration.liveness import Heartbeat
from dspark.integration.planner import PlannerTrace
from dspark.integration.round_sampler import RoundSampler
from dspark.integration.runtime_state import RuntimeStateStore
from dspark.kernels.sps import SpsTable
from dspark.models.decoding.round_cost import RoundClock
from dspark.models.decoding.sps_paths import sps_write_dir


@dataclass
class UpdateInFlight:
    """The `/set_internal_state` call for the dspark key now being handled (admin.py; SGLang handles one at a
    time and validates every key before it applies any): the update as validated and compiled (a refit resolved
    to what it fitted, so the fit runs once and the apply opens no file), why it was refused (and whether for a
    version conflict), or what an envelope-form update applied."""
    checked: Optional[tuple] = None
    refusal: Optional[str] = None
    conflict: bool = False
    applied: Optional[dict] = None


@dataclass
class SchedulerState:
    store: Optional[RuntimeStateStore] = None  # None until the DSpark planner exists (a scheduler process)
    group: Optional[torch.distributed.ProcessGroup] = None  # the TP ranks that run this batch (planner.batch_group)
    head_temperatures: Optional[torch.Tensor] = None  # the STS temperatures the confidence head applies now
    skipped_round: bool = False  # the drafting gate skipped this round's drafter: verify none of its placeholders
    trace: PlannerTrace = field(default_factory=PlannerTrace)
    clock: RoundClock = field(default_factory=RoundClock)
    probes: RoundSampler = field(default_factory=RoundSampler)  # calibration probe rounds (alike on every rank)
    traced: RoundSampler = field(default_factory=RoundSampler)  # rounds that get a span (tracing.py)
    calibration: LiveCalibration = field(default_factory=LiveCalibration)
    gate: ServedGate = field(default_factory=ServedGate)
    faults: FaultInjector = field(default_factory=FaultInjector.from_environment)
    update: UpdateInFlight = field(default_factory=UpdateInFlight)
    heartbeat: Heartbeat = field(default_factory=Heartbeat.from_environment)  # what GET /liveness reads
    scheduler: Any = None  # SGLang's Scheduler of this process, once set up (the SPS table is measured through it)
    awaiting_table: Any = None  # SGLang's DSpark planner while its store waits for the measured SPS table
    measured_tables: set = field(default_factory=set)  # paths of the SPS tables SGLang's forward measured here
    drafter: Optional[dict] = None  # the drafter the draft runners hold: path, version, ... (drafter_swap.py)
    target_version: Optional[str] = None  # the served target's fingerprint, once a swap needed it

    def sps_table(self) -> Optional[SpsTable]:
        """The SPS table the planner plans on now (None: no store, or a policy without a table)."""
        policy = self.store.planner.policy if self.store is not None else None
        return policy.sps if policy is not None else None

    def sps_source(self, path: Optional[str]) -> Optional[str]:
        """Where the table at `path` came from: sglang-forward (measured by SGLang's forward in this process, at
        start or by ProfileSps), cached (measured so on an earlier start: sps_forward.py), refit (fitted to live
        round costs: refit.py), or given (named by the operator)."""
        if path is None:
            return None
        if path in self.measured_tables:
            return "sglang-forward"
        where, home = Path(path).resolve(), sps_write_dir().resolve()
        if where.is_relative_to(home / "sglang"):
            return "cached"
        return "refit" if where.is_relative_to(home / "refit") else "given"

    def dspark_planned(self) -> bool:
        """Whether dspark's policies (not SGLang's own planner) plan the rounds."""
        return self.store is not None and self.store.planner.policy is not None

