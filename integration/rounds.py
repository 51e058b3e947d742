"""What the plugin observes of each verified DSpark round: its metrics (metrics.py), its span (tracing.py), its
calibration labels (calibration.py), its tokens per request for the drafting gate (drafting.py), and every
GAUGES_EVERY rounds the calibration and cost-model gauges and the automatic STS refit (refit.py).

Hooked AFTER SGLang's `DsparkStepObservers.observe_verify_step`, which every verified round calls with the
round's ragged layout (`layout.verify_lens` = 1 + drafts verified per request), acceptance (`correct_len`,
drafts accepted per request) and the confidence head's raw logits (`confidence_raw`).
"""
from __future__ import annotations

import torch

from dspark.integration import calibration, drafting, metrics, planner, refit, tracing

OBSERVERS = "sglang.srt.speculative.dspark_components.dspark_observability.DsparkStepObservers"
GAUGES_EVERY = 32


def _on_verify_step(result, observers, *, reqs, layout, correct_len, confidence_raw, **_) -> None:
    if layout is None or planner.store is None:  # not a ragged round planned by dspark
        return
    # One host copy for all the observers: [bs] drafts verified, and accepted (never more than verified)
    lengths = (layout.verify_lens - 1).long().cpu()
    accepted = torch.minimum(correct_len.long().cpu(), lengths)
    drafting.served.verified(accepted)
    metrics.observe_round(lengths, accepted, planner.trace.probe)
    state = planner.store.planner.state
    if confidence_raw is not None:
        calibration.window.observe(confidence_raw, lengths, accepted, planner.trace.probe)
    if planner.trace.total["rounds"] % GAUGES_EVERY == 0:
        periodic(state, confidence_raw is not None)
    tracing.observe_round(reqs=reqs, verify_lens=lengths, accepted=accepted, gamma=planner.store.gamma,
                          policy=state.policy, version=planner.store.version, ratio=state.trace_round_ratio,
                          planned_ns=planner.trace.planned_ns, planner_s=planner.trace.planner_s)


def periodic(state, calibrated: bool) -> None:
    """The gauges that cost a pass over a window, and the automatic refit that reads the same report."""
    table = refit.current_table()
    if metrics.enabled() and table is not None:
        metrics.observe_sps_error(planner.clock.costs.error(table, planner.clock.overhead()))
    if calibrated and (metrics.enabled() or state.auto_refit_ece is not None):
        report = calibration.window.report(planner.head_temperatures)
        metrics.observe_calibration(report)
        refit.maybe_auto_refit(report, state)


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{OBSERVERS}.observe_verify_step", _on_verify_step, HookType.AFTER)
