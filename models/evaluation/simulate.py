"""A scheduling simulator: the throughput-vs-concurrency curves past what this machine can run (up to 1024).

Driven only by measurements:
- the SPS table (target verify forwards per second by batch tokens, `dspark profile-sps`);
- the rest of a round's cost, a + b * R: drafting (every request's gamma slots, whatever the allocation),
  acceptance and bookkeeping; least squares of (round seconds - 1 / SPS(B)) over the measured rounds of the
  load benchmark;
- admission (prefill) seconds per request, and the mean tokens a request generates, from the same runs;
- acceptance traces (models/evaluation/scheduling.Traces): calibrated c_1..c_gamma and the accepted count n of
  recorded rounds that verified every draft.

Each simulated step, C request slots each draw a recorded round (iid, seeded); the policy allocates l per slot
(lagged: from the slot's previous draw); a slot accepts min(n, l) drafts and commits that + 1 tokens; the step
takes a + b * C + 1 / SPS(B) seconds with B = sum(1 + l), plus the admission cost of the requests its
tokens complete (tokens / mean tokens per request * admission seconds). Past the largest probe B_L the SPS curve is extrapolated
at constant tokens/s, SPS(B) = SPS(B_L) * B_L / B (compute-bound cost linear in B), and the allocator plans on
the same extended curve plus the step's overhead a + b * C, as the engine plans on its measured overhead
(models/decoding/round_cost.py). Every output of this module is labelled "simulation".

The policies are simulated drafting every round (the drafting gate is not modelled): their cost fit takes only
the measured rounds that ran the drafter. No speculation (scheduling.NO_SPEC) gets its own cost fit, from the
measured no-spec runs' rounds, and is one forward of C tokens per step committing C tokens (simulate_no_spec).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dspark.kernels.sps import SpsTable
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.evaluation.scheduling import NO_SPEC, Traces

SIMULATION = "simulation"


@dataclass(frozen=True)
class CostModel:
    sps: SpsTable  # extended to the largest simulated batch
    base_s: float  # a: per round
    per_request_s: float  # b: per running request
    admission_s: float  # per request, amortised over its tokens
    tokens_per_request: float

    def step_seconds(self, requests: int, batch_tokens: int) -> float:
        forward = 1.0 / float(self.sps.lookup(torch.tensor([batch_tokens]))[0])
        return self.base_s + self.per_request_s * requests + forward


def fit_cost(measured: list, sps: SpsTable, drafted: bool = True) -> CostModel:
    """The cost model from measured load runs (scheduling.measure_level rows) on the measured SPS curve:
    a, b by least squares of round seconds - 1/SPS(B) = a + b * R over the rounds that ran the drafter
    (drafted=False: those that did not), both clamped at >= 0. Rounds [R, B, seconds] without the drafted
    flag count as drafted."""
    data = torch.tensor([r[:3] for row in measured for r in row["rounds"] if ran_drafter(r) == drafted],
                        dtype=torch.float64)
    if not len(data):
        raise ValueError(f"no measured {'drafting' if drafted else 'plain'} rounds to fit the round cost on")
    rest = data[:, 2] - 1.0 / sps.lookup(data[:, 1].long())
    design = torch.stack([torch.ones_like(rest), data[:, 0]], dim=1)
    a, b = torch.linalg.lstsq(design, rest.unsqueeze(1)).solution.flatten().tolist()
    requests = sum(row["requests"] for row in measured)
    return CostModel(sps, max(a, 0.0), max(b, 0.0), sum(row["admission_s"] for row in measured) / requests,
                     sum(row["tokens"] for row in measured) / requests)


def ran_drafter(round_row: list) -> bool:
    """A measured round [R, B, seconds, drafted 0/1]; older 3-column rows predate the drafting gate."""
    return len(round_row) < 4 or bool(round_row[3])


def extend_sps(table: SpsTable, max_tokens: int) -> SpsTable:
    """The table plus doubling probes up to max_tokens at the last probe's tokens/s (module docstring)."""
    probes = dict(zip(table.sample_batch_tokens, table.sample_steps_per_sec))
    last, rate = table.sample_batch_tokens[-1], table.sample_steps_per_sec[-1]
    size = last
    while size < max_tokens:
        size = min(2 * size, max_tokens)
        probes[size] = rate * last / size
    return SpsTable.from_probes(probes, max(max_tokens, table.max_batch_tokens))


def simulate(cost: CostModel, traces: Traces, policy: VerifyLengthPolicy, concurrency: int, steps: int = 200,
             seed: int = 0) -> dict:
    """Steady-state metrics of one policy at one concurrency, in the load benchmark's units."""
    if policy.sps is not None:
        policy = replace(policy, sps=cost.sps.with_overhead(cost.base_s + cost.per_request_s * concurrency))
    generator = torch.Generator().manual_seed(seed)
    lagged = None
    tokens = seconds = verified = 0.0
    for _ in range(steps):
        draw = torch.randint(len(traces.accepted), (concurrency,), generator=generator)
        confidence = traces.confidence[draw]
        lengths = policy.lengths(confidence, lagged, torch.full((concurrency,), confidence.shape[1]))
        lagged = confidence
        verified += float(lengths.sum())
        committed = float((torch.minimum(traces.accepted[draw], lengths) + 1).sum())
        tokens += committed
        seconds += cost.step_seconds(concurrency, int(lengths.sum()) + concurrency)
        seconds += committed / cost.tokens_per_request * cost.admission_s
    slots = steps * concurrency
    return {"concurrency": concurrency, "goodput_tok_s": tokens / seconds, "verify_budget": verified / slots,
            "tau": tokens / slots, "request_tok_s": tokens / slots / (seconds / steps), "source": SIMULATION}


def simulate_no_spec(cost: CostModel, concurrency: int) -> dict:
    """Steady-state plain decoding at one concurrency (cost fitted on no-spec rounds): every step one forward of
    C tokens commits C tokens; the same units and label as simulate()."""
    seconds = cost.step_seconds(concurrency, concurrency) + concurrency / cost.tokens_per_request * cost.admission_s
    return {"policy": NO_SPEC, "concurrency": concurrency, "goodput_tok_s": concurrency / seconds,
            "verify_budget": 0.0, "tau": 1.0, "request_tok_s": 1.0 / seconds, "source": SIMULATION}
