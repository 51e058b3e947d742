"""Throughput under load: continuous batching in the reference engine, `repeats` runs per (policy, concurrency).

At concurrency C the engine keeps at most C requests running (SpeculativeDecoder.generate(max_running=C));
the run decodes max(min_requests, requests_per_slot * C) requests cycled from a fixed prompt set, so the batch
stays full for most of it. Per run (all from the engine's own timings, BatchRound and Generation):

  goodput            committed tokens / wall seconds of the whole run
  verify_budget      mean drafts verified per request per round, sum(B - R) / sum(R)
  tau                mean tokens committed per request per target forward, sum(n + 1) / sum(R)
  request_tok_s      mean over requests of tokens / (finished - admitted): the per-user speed
  admission_s        the rest of the wall time: prefills of joining requests and batch bookkeeping
  rounds             per round [R, B, seconds, drafted 0/1]; with admission_s, the simulator's cost fit
  request_rounds     sum(R): request-rounds, one target forward each for each request
  accepted_histogram request-rounds by drafts accepted, 0..gamma (acceptance.accepted_histogram)
  drafted_share      share of rounds that ran the drafter (below 1 when the drafting gate skipped it)
  vs_no_spec         goodput / the no-speculation run's goodput at the same concurrency (with_no_spec_ratio)

Every measure_load decodes a no-speculation run (NO_SPEC: the target alone, the engine's drafter-free path)
at each concurrency in the same session, so each policy is compared with plain decoding measured under the
same machine load; both paths are warmed up first so neither pays first-call allocations inside a run.

A shared 2-core VM's speed drifts and spikes between runs by as much as the effects measured (one run each put
plain-decoding rows at 0.92-1.15x of no-spec), so each (policy, concurrency) runs `repeats` times. Each repeat
runs no-spec and every policy back to back at one concurrency, in an order rotated by one each repeat; a row
pools its runs (pooled): goodput_runs lists each run's goodput, goodput_tok_s is their median, and vs_no_spec
is the median of the repeats' paired ratios, goodput_runs[i] / no-spec's goodput_runs[i] (vs_no_spec_runs).

Rounds decoded with every draft verified (the `fixed` policy) also yield acceptance traces for the simulator:
per request-round, the calibrated confidences c_1..c_gamma and n, the drafts accepted with all gamma verified.
Verifying only l of them would have accepted min(n, l): the acceptance tests of the first l positions are the
same tests.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from tqdm import tqdm

from dspark.models.decoding.engine import BatchRound, GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.drafters.base import Drafter
from dspark.models.errors import ConfigError
from dspark.models.evaluation.acceptance import accepted_histogram
from dspark.models.evaluation.paired import paired_ratio
from dspark.models.evaluation.run import warm_up

NO_SPEC = "no-spec"  # the target alone: every round verifies only the anchor


@dataclass(frozen=True)
class LoadSettings:
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    requests_per_slot: int = 2
    min_requests: int = 16
    config: GenerationConfig = GenerationConfig()
    seed: int = 0
    repeats: int = 1

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        if self.requests_per_slot < 1 or self.min_requests < 1:
            raise ConfigError("requests_per_slot and min_requests must be >= 1")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")

    def requests(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_slot * concurrency)


@dataclass(frozen=True)
class Traces:
    """Per request-round acceptance traces of full-length verification (module docstring)."""

    confidence: torch.Tensor  # [N, gamma] calibrated c_k
    accepted: torch.Tensor  # [N] long, n with every draft verified


def measure_level(decoder: SpeculativeDecoder, prompts: Sequence[List[int]], concurrency: int,
                  settings: LoadSettings) -> tuple[dict, list]:
    """One continuous-batching run: (metrics, the generations)."""
    count = settings.requests(concurrency)
    batch = [prompts[i % len(prompts)] for i in range(count)]
    trace: List[BatchRound] = []
    generator = torch.Generator().manual_seed(settings.seed)
    began = time.perf_counter()
    generations = decoder.generate(batch, settings.config, generator, max_running=concurrency, trace=trace)
    wall = time.perf_counter() - began
    tokens = sum(len(g.token_ids) for g in generations)
    slots = sum(r.requests for r in trace)
    gamma = decoder.drafter.config.gamma if decoder.drafter is not None else 0
    metrics = {
        "concurrency": concurrency, "requests": count, "tokens": tokens, "wall_s": wall,
        "goodput_tok_s": tokens / wall,
        "verify_budget": sum(r.verify_tokens - r.requests for r in trace) / max(slots, 1),
        "tau": sum(r.committed for r in trace) / max(slots, 1),
        "request_tok_s": sum(len(g.token_ids) / (g.finished_s - g.admitted_s) for g in generations) / count,
        "admission_s": wall - sum(r.draft_s + r.verify_s for r in trace),
        "request_rounds": slots,
        "accepted_histogram": accepted_histogram([r for g in generations for r in g.rounds], gamma),
        "drafted_share": sum(r.drafted for r in trace) / max(len(trace), 1),
        "rounds": [[r.requests, r.verify_tokens, r.draft_s + r.verify_s, int(r.drafted)] for r in trace],
    }
    return metrics, generations


def full_length_traces(generations, gamma: int, sts_temperatures: Optional[torch.Tensor]) -> Optional[Traces]:
    """Traces from rounds that verified all gamma drafts (and carried confidences); None if there are none."""
    rows = [(r.confidence_logits, r.accepted) for g in generations for r in g.rounds
            if r.verify_len == gamma and r.confidence_logits is not None]
    if not rows:
        return None
    logits = torch.tensor([row[0] for row in rows])
    if sts_temperatures is not None:
        logits = logits / sts_temperatures
    return Traces(torch.sigmoid(logits), torch.tensor([row[1] for row in rows]))


def measure_load(target: torch.nn.Module, drafter: Drafter, prompts: Sequence[List[int]],
                 policies: Dict[str, VerifyLengthPolicy], settings: LoadSettings,
                 sts_temperatures: Optional[torch.Tensor] = None,
                 drafting: str = "always") -> tuple[List[dict], Optional[Traces]]:
    """NO_SPEC and every policy (drafting: the drafting gate's mode) at every concurrency, settings.repeats times,
    with a progress bar: (one row per (policy, concurrency), its runs pooled, with vs_no_spec; traces)."""
    decoders = {NO_SPEC: SpeculativeDecoder(target)}
    decoders |= {name: SpeculativeDecoder(target, drafter, policy, sts_temperatures, drafting)
                 for name, policy in policies.items()}
    warm_up(list(decoders.values()), prompts[:2], settings.config, settings.seed, max_running=2)
    runs, traces = {}, []
    # every policy at one concurrency runs next to that concurrency's no-spec run, so a slow drift in the
    # machine's speed does not favour whichever policy happens to be measured first; rotating the order each
    # repeat moves each policy's place relative to no-spec
    names = list(decoders)
    order = [(names[(i + repeat) % len(names)], c) for c in settings.concurrency for repeat in range(settings.repeats)
             for i in range(len(names))]
    for name, concurrency in tqdm(order, desc="bench-sched", unit="run"):
        metrics, generations = measure_level(decoders[name], prompts, concurrency, settings)
        runs.setdefault((name, concurrency), []).append(metrics)
        policy = policies.get(name)
        if policy is not None and policy.name == "fixed" and policy.settings.max_verify_length is None:
            traces.append(full_length_traces(generations, drafter.config.gamma, sts_temperatures))
    traces = [t for t in traces if t is not None]
    merged = Traces(torch.cat([t.confidence for t in traces]), torch.cat([t.accepted for t in traces])) \
        if traces else None
    rows = [{"policy": name, **pooled(runs[(name, c)])} for name in names for c in settings.concurrency]
    return with_no_spec_ratio(rows), merged


def pooled(runs: List[dict]) -> dict:
    """One row from the repeated runs of one (policy, concurrency) (measure_level metrics, in run order): the
    median run's goodput, every run's goodput, and the counts and per-round means over all their rounds."""
    slots = sum(r["request_rounds"] for r in runs)
    requests = sum(r["requests"] for r in runs)
    rounds = [x for r in runs for x in r["rounds"]]
    return {
        "concurrency": runs[0]["concurrency"], "requests": requests, "tokens": sum(r["tokens"] for r in runs),
        "wall_s": sum(r["wall_s"] for r in runs),
        "goodput_tok_s": statistics.median(r["goodput_tok_s"] for r in runs),
        "goodput_runs": [r["goodput_tok_s"] for r in runs],
        "verify_budget": sum(r["verify_budget"] * r["request_rounds"] for r in runs) / max(slots, 1),
        "tau": sum(r["tau"] * r["request_rounds"] for r in runs) / max(slots, 1),
        "request_tok_s": sum(r["request_tok_s"] * r["requests"] for r in runs) / requests,
        "admission_s": sum(r["admission_s"] for r in runs),
        "request_rounds": slots,
        "accepted_histogram": [sum(counts) for counts in zip(*(r["accepted_histogram"] for r in runs))],
        "drafted_share": sum(x[3] for x in rounds) / max(len(rounds), 1),
        "rounds": rounds,
    }


def with_no_spec_ratio(rows: List[dict]) -> List[dict]:
    """Each row plus vs_no_spec, its goodput over the NO_SPEC row's at its concurrency (None without one);
    measured and simulated rows each need their own NO_SPEC rows. Rows pooled from repeats (goodput_runs) pair
    run i with no-spec's run i and take the median of those ratios (vs_no_spec_runs)."""
    plain = {r["concurrency"]: r for r in rows if r["policy"] == NO_SPEC}
    return [{**r, **no_spec_ratio(r, plain.get(r["concurrency"]))} for r in rows]


def no_spec_ratio(row: dict, plain: Optional[dict]) -> dict:
    if plain is None:
        return {"vs_no_spec": None}
    if "goodput_runs" not in row:
        return {"vs_no_spec": row["goodput_tok_s"] / plain["goodput_tok_s"]}
    ratio, paired = paired_ratio(row["goodput_runs"], plain["goodput_runs"])
    return {"vs_no_spec": ratio, "vs_no_spec_runs": paired}
