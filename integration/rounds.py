"""What the plugin observes of each verified DSpark round: its metrics (metrics.py), its span (tracing.py), its
calibration labels (calibration.py), its tokens per request for the drafting gate (drafting.py), and every
GAUGES_EVERY rounds the calibration and cost-model gauges and the automatic STS refit (refit.py).

Hooked AFTER SGLang's `DsparkStepObservers.observe_verify_step`, which every verified round calls with the
round's ragged layout (`layout.verify_lens` = 1 + drafts verified per request), acceptance (`correct_len`,
drafts accepted per request) and the confidence head's raw logits (`confidence_raw`).
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from dspark.integration import metrics, refit, tracing

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

OBSERVERS = "sglang.srt.speculative.dspark_components.dspark_observability.DsparkStepObservers"
GAUGES_EVERY = 32


def _on_verify_step(state: SchedulerState, result, observers, *, reqs, layout, correct_len, confidence_raw,
                    **_) -> None:
    if layout is None or state.store is None:  # not a ragged round planned by dspark
        return
    # One host copy for all the observers: [bs] drafts verified, and accepted (never more than verified)
    lengths = (layout.verify_lens - 1).long().cpu()
    accepted = torch.minimum(correct_len.long().cpu(), lengths)
    state.gate.verified(accepted)
    trace, store = state.trace, state.store
    metrics.observe_round(lengths, accepted, trace.probe)
    settings = store.planner.state
    if confidence_raw is not None:
        state.calibration.observe(confidence_raw, lengths, accepted, trace.probe)
    if trace.total["rounds"] % GAUGES_EVERY == 0:
        periodic(state, confidence_raw is not None)
    tracing.observe_round(state.traced, reqs=reqs, verify_lens=lengths, accepted=accepted, gamma=store.gamma,
                          policy=settings.policy, version=store.version, ratio=settings.trace_round_ratio,
                          planned_ns=trace.planned_ns, planner_s=trace.planner_s)


def periodic(state: SchedulerState, calibrated: bool) -> None:
    """The gauges that cost a pass over a window, and the automatic refit that reads the same report."""
    table, settings = state.sps_table(), state.store.planner.state
    if metrics.enabled() and table is not None:
        metrics.observe_sps_error(state.clock.costs.error(table, state.clock.overhead()))
    if calibrated and (metrics.enabled() or settings.auto_refit_ece is not None):
        report = state.calibration.report(state.head_temperatures)
        metrics.observe_calibration(report)
        refit.maybe_auto_refit(state, report, settings)


def install(state: SchedulerState) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{OBSERVERS}.observe_verify_step", partial(_on_verify_step, state), HookType.AFTER)
