"""dspark's Prometheus metrics on SGLang's own `/metrics` (with `--enable-metrics`), from the scheduler processes.

SGLang serves /metrics from its HTTP process with prometheus_client's multiprocess collector over
PROMETHEUS_MULTIPROC_DIR, so metrics created here, in a scheduler process, appear there too (gauges say how
their per-process values combine). They are created on first use, never at import: prometheus_client picks its
multiprocess storage when it is imported, after SGLang has set the directory. Only the first rank of each
batch's tensor-parallel group reports, so a TP=8 server does not count every round eight times.

    dspark_rounds_total                             speculative rounds dspark planned
    dspark_verify_length                            drafts verified per request per round (histogram)
    dspark_accepted_length                          drafts accepted per request per round (histogram)
    dspark_verify_tokens_per_forward                tokens per verify forward, sum of (1 + l_r) (histogram)
    dspark_position_verified_total{position}        drafts verified at block position k = 1..gamma
    dspark_position_accepted_total{position}        ... of which accepted (acceptance by position: the ratio)
    dspark_accepted_tokens_total                    accepted drafts plus one bonus/correction token per request
    dspark_state_version                            the live settings' version
    dspark_state_last_change_timestamp_seconds      when it last changed (unix time)
    dspark_state_updates_total{result}              dspark updates: applied, validated, refused, conflict
    dspark_sps_table_info{source,path}              1 for the SPS table in use (source: sglang-forward | cached |
                                                    refit | given: SchedulerState.sps_source)
    dspark_sps_table_timestamp_seconds              when that table was written (its age: time() - this)
    dspark_sps_table_error_ratio                    median |table time + overhead - measured round time| /
                                                    measured, over the live round-cost window
                                                    (models/decoding/round_cost.py)
    dspark_step_overhead_seconds                    per-round time beyond the profiled verify forward
    dspark_probe_rounds_total                       rounds verified in full for calibration labels
    dspark_draft_faults_total{error}                draft steps that failed and were retried (draft_faults.py)
    dspark_draft_skipped_rounds_total               rounds whose drafter the drafting gate skipped (drafting.py)
    dspark_calibration_ece{position}                live per-position ECE of the survival a_k (calibration.py)
    dspark_calibration_survival_gap{position}       mean predicted a_k minus the realized survival rate
    dspark_calibration_window_samples               labelled request-rounds in the live window
    dspark_sglang_restarts                          times `dspark serve` started SGLang again after it exited
                                                    by itself (RESTARTS_ENV; set when the state is installed)
    dspark_drafter_info{version}                    1 for the drafter the draft runners hold (the sha256 of its
                                                    weights; 0 for one swapped out: drafter_swap.py)

and from SGLang's HTTP process, where the request gate runs (request_gate.py):

    dspark_gate_sub_requests_in_flight              sub-requests (prompts x n) admitted and not yet answered:
                                                    the load that max_queued_requests bounds
    dspark_gate_refused_requests_total{status,field}  requests the gate answered itself (413, 400, 429, 404, 415)
    dspark_capture_records_total                    served replies the capture wrote (capture.py; --capture)
    dspark_capture_dropped_records_total{reason}    captured replies not written: queue_full, over_budget,
                                                    disk_full, write_error, too_large, unsupported,
                                                    redaction_timeout (capture_writer.py)

The histograms take a whole round at once (`observe_counts`: one bucket increment per distinct value, not one
observe() per request) so that a round of 256 requests costs a few increments.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Optional

import torch

RESTARTS_ENV = "DSPARK_SGLANG_RESTARTS"  # `dspark serve` counts the restarts and hands the count over
MAX_GAMMA = 16  # length histograms get one bucket per length up to this
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def metrics_on() -> bool:
    """Whether SGLang set up its multiprocess metrics (`--enable-metrics`) for this process tree."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def enabled() -> bool:
    """Whether this scheduler process reports."""
    return metrics_on() and reporting_rank()


@lru_cache(maxsize=1)
def reporting_rank() -> bool:
    """Whether this process is the first rank of its batch's TP group (the only one that reports)."""
    try:
        from sglang.srt.layers.dp_attention import get_dp_tp_group

        return get_dp_tp_group().rank_in_group == 0
    except (ImportError, AssertionError, AttributeError):  # no distributed groups: a single process
        return True


@lru_cache(maxsize=1)
def registry() -> dict:
    """The metrics, created once per process (after SGLang set PROMETHEUS_MULTIPROC_DIR)."""
    from prometheus_client import Counter, Gauge, Histogram

    lengths = tuple(range(MAX_GAMMA + 1))
    return {
        "rounds": Counter("dspark_rounds", "speculative rounds planned by dspark"),
        "verify_length": Histogram("dspark_verify_length", "drafts verified per request per round",
                                   buckets=lengths),
        "accepted_length": Histogram("dspark_accepted_length", "drafts accepted per request per round",
                                     buckets=lengths),
        "verify_tokens": Histogram("dspark_verify_tokens_per_forward", "tokens per verify forward, sum of "
                                   "(1 + drafts verified)", buckets=TOKEN_BUCKETS),
        "verified": Counter("dspark_position_verified", "drafts verified at each block position", ["position"]),
        "accepted": Counter("dspark_position_accepted", "drafts accepted at each block position", ["position"]),
        "accepted_tokens": Counter("dspark_accepted_tokens", "accepted drafts plus one bonus or correction "
                                   "token per request and round"),
        "version": Gauge("dspark_state_version", "version of the live dspark settings",
                         multiprocess_mode="livemax"),
        "changed": Gauge("dspark_state_last_change_timestamp_seconds", "when the live dspark settings last "
                         "changed", multiprocess_mode="livemax"),
        "updates": Counter("dspark_state_updates", "dspark settings updates by result", ["result"]),
        "sps_info": Gauge("dspark_sps_table_info", "1 for the SPS table the SPS policies plan on",
                          ["source", "path"], multiprocess_mode="livemax"),
        "sps_time": Gauge("dspark_sps_table_timestamp_seconds", "when the SPS table in use was written",
                          multiprocess_mode="livemax"),
        "sps_error": Gauge("dspark_sps_table_error_ratio", "median relative error of the planner's round time "
                           "(SPS table plus overhead) against measured round times", multiprocess_mode="livemax"),
        "probes": Counter("dspark_probe_rounds", "rounds verified in full for calibration labels"),
        "draft_faults": Counter("dspark_draft_faults", "draft steps that failed and were retried", ["error"]),
        "skipped_drafts": Counter("dspark_draft_skipped_rounds", "rounds whose drafter the drafting gate skipped "
                                  "(the anchors verified alone)"),
        "overhead": Gauge("dspark_step_overhead_seconds", "per-round time beyond the profiled verify forward",
                          multiprocess_mode="livemax"),
        "ece": Gauge("dspark_calibration_ece", "live per-position ECE of the predicted survival", ["position"],
                     multiprocess_mode="livemax"),
        "gap": Gauge("dspark_calibration_survival_gap", "mean predicted survival minus the realized rate",
                     ["position"], multiprocess_mode="livemax"),
        "samples": Gauge("dspark_calibration_window_samples", "labelled request-rounds in the live window",
                         multiprocess_mode="livemax"),
        "drafter": Gauge("dspark_drafter_info", "1 for the drafter served (version: the sha256 of its weights)",
                         ["version"], multiprocess_mode="livemax"),
        "restarts": Gauge("dspark_sglang_restarts", "times dspark serve started SGLang again after it exited by "
                          "itself", multiprocess_mode="livemax"),
    }


@lru_cache(maxsize=1)
def gate_registry() -> dict:
    """The request gate's metrics, created once in SGLang's HTTP process."""
    from prometheus_client import Counter, Gauge

    return {
        "in_flight": Gauge("dspark_gate_sub_requests_in_flight", "sub-requests (prompts x n) the request gate "
                           "admitted and SGLang has not answered yet", multiprocess_mode="livesum"),
        "refused": Counter("dspark_gate_refused_requests", "requests the request gate answered itself, by status "
                           "and the field it named", ["status", "field"]),
    }


@lru_cache(maxsize=1)
def capture_registry() -> dict:
    """The capture's metrics, created once in SGLang's HTTP process (its writer thread counts)."""
    from prometheus_client import Counter

    return {
        "written": Counter("dspark_capture_records", "served replies the capture wrote"),
        "dropped": Counter("dspark_capture_dropped_records", "captured replies the capture did not write, by "
                           "reason", ["reason"]),
    }


def observe_counts(histogram, values: torch.Tensor) -> None:
    """observe() every value of `values` [n] (integers), with one increment per bucket that gets any.

    prometheus_client 0.26 (pinned) keeps non-cumulative bucket values in `_buckets` and the sum in `_sum`;
    tests/integration/test_metrics.py checks this against observe() one value at a time."""
    bounds = torch.tensor(histogram._upper_bounds[:-1], dtype=torch.float64)  # +Inf takes the rest
    index = torch.searchsorted(bounds, values.double(), right=False)
    for bucket, count in zip(*torch.unique(index, return_counts=True)):
        histogram._buckets[int(bucket)].inc(int(count))
    histogram._sum.inc(float(values.sum()))


def observe_round(verify_lens: torch.Tensor, accepted: torch.Tensor, probe: bool) -> None:
    """One verified round: verify_lens [bs] long (host) drafts verified per request, accepted [bs] long (host)
    drafts accepted, each <= its verify length; probe: a calibration probe round."""
    if not enabled():
        return
    metrics = registry()
    metrics["rounds"].inc()
    if probe:
        metrics["probes"].inc()
    observe_counts(metrics["verify_length"], verify_lens)
    observe_counts(metrics["accepted_length"], accepted)
    observe_counts(metrics["verify_tokens"], (verify_lens + 1).sum().reshape(1))
    metrics["accepted_tokens"].inc(int(accepted.sum()) + len(accepted))
    for k in range(1, int(verify_lens.max()) + 1 if len(verify_lens) else 1):
        metrics["verified"].labels(position=str(k)).inc(int((verify_lens >= k).sum()))
        metrics["accepted"].labels(position=str(k)).inc(int((accepted >= k).sum()))


def observe_state(version: int, changed_at: float, sps_table: Optional[str], source: Optional[str],
                  previous_table: Optional[str], previous_source: Optional[str]) -> None:
    """The live settings changed (or were installed at start); each table with where it came from."""
    if not enabled():
        return
    metrics = registry()
    metrics["restarts"].set(int(os.environ.get(RESTARTS_ENV) or 0))
    metrics["version"].set(version)
    metrics["changed"].set(changed_at)
    if previous_table is not None and previous_table != sps_table:
        metrics["sps_info"].labels(source=previous_source, path=previous_table).set(0)
    if sps_table is not None:
        metrics["sps_info"].labels(source=source, path=sps_table).set(1)
        path = Path(sps_table)
        metrics["sps_time"].set(path.stat().st_mtime if path.is_file() else 0)


def observe_drafter(version: str, previous: Optional[str]) -> None:
    """The drafter served: at the first report, and after each swap."""
    if not enabled():
        return
    if previous is not None and previous != version:
        registry()["drafter"].labels(version=previous).set(0)
    registry()["drafter"].labels(version=version).set(1)


def observe_update(result: str) -> None:
    if enabled():
        registry()["updates"].labels(result=result).inc()


def observe_overhead(seconds: float) -> None:
    if enabled():
        registry()["overhead"].set(seconds)


def observe_draft_fault(error: str) -> None:
    if enabled():
        registry()["draft_faults"].labels(error=error).inc()


def observe_skipped_draft() -> None:
    if enabled():
        registry()["skipped_drafts"].inc()


def observe_sps_error(ratio: Optional[float]) -> None:
    if enabled() and ratio is not None:
        registry()["sps_error"].set(ratio)


def observe_calibration(report: dict) -> None:
    """The live calibration report (calibration.py): positions with no labels yet are left out."""
    if not enabled():
        return
    metrics = registry()
    metrics["samples"].set(report["samples"])
    for k, (ece, gap) in enumerate(zip(report["ece"], report["survival_gap"]), start=1):
        if ece is not None:
            metrics["ece"].labels(position=str(k)).set(ece)
            metrics["gap"].labels(position=str(k)).set(gap)


def observe_gate_in_flight(count: int) -> None:
    if metrics_on():  # the HTTP process: no tensor-parallel rank to ask
        gate_registry()["in_flight"].set(count)


def observe_gate_refusal(status: int, field: str) -> None:
    """field: Refused.counted_as, one of a fixed set (never a key a client wrote), so the labels stay bounded."""
    if metrics_on():
        gate_registry()["refused"].labels(status=str(status), field=field).inc()


def observe_capture_written() -> None:
    if metrics_on():
        capture_registry()["written"].inc()


def observe_capture_dropped(reason: str, count: int = 1) -> None:
    """reason: one of capture_writer.REASONS; count 0 lists the label before the first drop."""
    if metrics_on():
        capture_registry()["dropped"].labels(reason=reason).inc(count)
