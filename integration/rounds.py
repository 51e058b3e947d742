"""What the plugin observes of each verified DSpark round: its metrics (metrics.py), its span (tracing.py) and
its calibration labels (calibration.py).

Hooked AFTER SGLang's `DsparkStepObservers.observe_verify_step`, which every verified round calls with the
round's ragged layout (`layout.verify_lens` = 1 + drafts verified per request), acceptance (`correct_len`,
drafts accepted per request) and the confidence head's raw logits (`confidence_raw`). The calibration gauges
are recomputed every CALIBRATION_EVERY rounds.
"""
from __future__ import annotations

import torch

from dspark.integration import calibration, metrics, planner, tracing

OBSERVERS = "sglang.srt.speculative.dspark_components.dspark_observability.DsparkStepObservers"
CALIBRATION_EVERY = 32


def _on_verify_step(result, observers, *, reqs, layout, correct_len, confidence_raw, **_) -> None:
    if layout is None or planner.store is None:  # not a ragged round planned by dspark
        return
    # One host copy for all three observers: [bs] drafts verified, and accepted (never more than verified)
    lengths = (layout.verify_lens - 1).long().cpu()
    accepted = torch.minimum(correct_len.long().cpu(), lengths)
    metrics.observe_round(lengths, accepted)
    if confidence_raw is not None:
        calibration.window.observe(confidence_raw, lengths, accepted)
        if metrics.enabled() and planner.trace.total["rounds"] % CALIBRATION_EVERY == 0:
            metrics.observe_calibration(calibration.window.report(planner.head_temperatures))
    state = planner.store.planner.state
    tracing.observe_round(reqs=reqs, verify_lens=lengths, accepted=accepted, gamma=planner.store.gamma,
                          policy=state.policy, version=planner.store.version, ratio=state.trace_round_ratio,
                          planned_ns=planner.trace.planned_ns, planner_s=planner.trace.planner_s)


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{OBSERVERS}.observe_verify_step", _on_verify_step, HookType.AFTER)
