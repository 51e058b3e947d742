"""What the plugin observes of each verified DSpark round: its metrics (metrics.py) and its span (tracing.py).

Hooked AFTER SGLang's `DsparkStepObservers.observe_verify_step`, which every verified round calls with the
round's ragged layout (`layout.verify_lens` = 1 + drafts verified per request) and acceptance (`correct_len`,
drafts accepted per request).
"""
from __future__ import annotations

from dspark.integration import metrics, planner, tracing

OBSERVERS = "sglang.srt.speculative.dspark_components.dspark_observability.DsparkStepObservers"


def _on_verify_step(result, observers, *, reqs, layout, correct_len, **_) -> None:
    if layout is None or planner.store is None:  # not a ragged round planned by dspark
        return
    lengths = layout.verify_lens - 1
    metrics.observe_round(lengths, correct_len)
    state = planner.store.planner.state
    tracing.observe_round(reqs=reqs, verify_lens=lengths, accepted=correct_len, gamma=planner.store.gamma,
                          policy=state.policy, version=planner.store.version, ratio=state.trace_round_ratio,
                          planned_ns=planner.trace.planned_ns, planner_s=planner.trace.planner_s)


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{OBSERVERS}.observe_verify_step", _on_verify_step, HookType.AFTER)
