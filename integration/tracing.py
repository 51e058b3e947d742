"""`dspark.round` spans: a sampled share of DSpark's speculative rounds, traced through SGLang's own tracer.

With tracing on (`dspark serve --otlp-endpoint`, which passes SGLang `--enable-trace`), SGLang installs a global
OpenTelemetry TracerProvider in every process, the scheduler included; a round span uses it. A share
`trace_round_ratio` of the rounds (a live setting, models/decoding/settings.py) is traced, spread evenly: round n
is traced when floor((n + 1) * ratio) > floor(n * ratio) (round_sampler.py). Only the first rank of each tensor-parallel group
traces (the others run the same round).

    dspark.round   from planning to the end of verification; links to the root span of every request in the
                   batch that SGLang traces
      dspark.batch_size, dspark.drafted_tokens (batch x gamma), dspark.verify_tokens (sum of 1 + l_r),
      dspark.verify_length.mean / .min / .max, dspark.accepted_tokens (accepted drafts + 1 per request),
      dspark.policy, dspark.state_version, dspark.planner_time_s
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from dspark.integration import metrics
from dspark.integration.round_sampler import RoundSampler

ROUND_SPAN = "dspark.round"


def tracing_on() -> bool:
    try:
        from sglang.srt.observability.trace import get_global_tracing_enabled
    except ImportError:
        return False
    return get_global_tracing_enabled() and metrics.reporting_rank()


def request_links(reqs) -> list:
    """Links to the root spans of the batch's traced requests (SGLang keeps them in time_stats.trace_ctx)."""
    from opentelemetry import trace

    links = []
    for req in reqs:
        context = getattr(getattr(getattr(req, "time_stats", None), "trace_ctx", None), "root_span_context", None)
        if context is not None:
            span_context = trace.get_current_span(context).get_span_context()
            if span_context.is_valid:
                links.append(trace.Link(span_context))
    return links


def observe_round(sampler: RoundSampler, *, reqs, verify_lens: torch.Tensor, accepted: torch.Tensor, gamma: int,
                  policy: str, version: int, ratio: float, planned_ns: Optional[int], planner_s: float) -> None:
    """Emit this round's span if tracing is on and `sampler` takes the round. verify_lens, accepted: [bs] long
    (host), accepted <= verify_lens."""
    if not tracing_on() or not sampler.take(ratio):
        return
    from opentelemetry import trace

    span = trace.get_tracer("dspark").start_span(ROUND_SPAN, start_time=planned_ns or time.time_ns(),
                                                links=request_links(reqs))
    span.set_attributes({
        "dspark.batch_size": len(verify_lens), "dspark.drafted_tokens": len(verify_lens) * gamma,
        "dspark.verify_tokens": int((verify_lens + 1).sum()),
        "dspark.verify_length.mean": float(verify_lens.double().mean()) if len(verify_lens) else 0.0,
        "dspark.verify_length.min": int(verify_lens.min()) if len(verify_lens) else 0,
        "dspark.verify_length.max": int(verify_lens.max()) if len(verify_lens) else 0,
        "dspark.accepted_tokens": int(accepted.sum()) + len(verify_lens), "dspark.policy": policy,
        "dspark.state_version": version, "dspark.planner_time_s": planner_s})
    span.end()
