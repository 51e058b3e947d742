"""What acceptance a chain drafter needs to pay on this machine: the expected speedup at batch 1 from measured costs.

A round that drafts and verifies k drafts, the j-th accepted with probability alpha_j given that the earlier ones
were, commits 1 + sum_{j<=k} prod_{i<=j} alpha_i tokens in expectation (the 1 is the correction or bonus token).
It costs the drafting pass (draft_s, measured) plus a plain round (plain_s, measured: the decode forward and the
loop around it) grown as the target's forward grows from 1 to 1 + k tokens (the SPS table, `dspark profile-sps`).
The table enters only as that ratio: a shared machine runs at different speeds from one minute to the next, and a
profile taken in a slow minute then still has the right shape. A plain round commits one token. So verifying k
drafts every round runs at

    speedup(k) = (1 + sum_{j<=k} prod_{i<=j} alpha_i) * plain_s / (draft_s + plain_s * SPS(1) / SPS(1 + k))

times plain decoding, and `best_verify_len` picks the k in 1..gamma that maximises it. `acceptance_for` inverts it
for one alpha at every position: the acceptance a drafter needs on these costs to reach a given speedup (1: to
break even). A per-round allocator (causal) can do better than any fixed k only as far as its confidences tell
the rounds apart; the gate's plain rounds are speedup 1.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dspark.kernels.sps import SpsTable

BISECTION_STEPS = 40  # alpha to within 1e-12
REPORTED_SPEEDUPS = (1.0, 1.5, 2.0)  # the acceptance each needs goes into the report
MIN_REACHED = 10  # rounds behind a measured acceptance rate for the report to use it


@dataclass(frozen=True)
class ChainCosts:
    table: SpsTable  # the target's verify forwards per second by batch tokens (`dspark profile-sps`)
    plain_s: float  # a plain decoding round
    draft_s: float  # the drafting pass of a drafting round

    def __post_init__(self) -> None:
        if not (math.isfinite(self.plain_s) and self.plain_s > 0):
            raise ValueError(f"plain_s must be finite and > 0 seconds, got {self.plain_s}")
        if not (math.isfinite(self.draft_s) and self.draft_s >= 0):
            raise ValueError(f"draft_s must be finite and >= 0 seconds, got {self.draft_s}")

    def round_s(self, verify_len: int) -> float:
        """A drafting round that verifies verify_len drafts (module docstring)."""
        sps = self.table.lookup(torch.tensor([1, 1 + verify_len]))
        return self.draft_s + self.plain_s * float(sps[0] / sps[1])


def expected_tokens(acceptance: Sequence[float], verify_len: int) -> float:
    """1 + sum over j <= verify_len of the survival prod_{i<=j} alpha_i."""
    if not 0 <= verify_len <= len(acceptance):
        raise ValueError(f"verify_len must be in 0..{len(acceptance)}, got {verify_len}")
    survival = torch.tensor(list(acceptance[:verify_len]), dtype=torch.float64).cumprod(0)
    return 1.0 + float(survival.sum())


def expected_speedup(acceptance: Sequence[float], costs: ChainCosts, verify_len: int) -> float:
    """Drafting every round and verifying verify_len drafts, against plain decoding (module docstring)."""
    return expected_tokens(acceptance, verify_len) * costs.plain_s / costs.round_s(verify_len)


def best_verify_len(acceptance: Sequence[float], costs: ChainCosts) -> tuple[int, float]:
    """(k, speedup(k)) for the k in 1..len(acceptance) with the highest expected speedup."""
    if not acceptance:
        raise ValueError("acceptance needs at least one position")
    return max(((k, expected_speedup(acceptance, costs, k)) for k in range(1, len(acceptance) + 1)),
               key=lambda pair: pair[1])


def acceptance_for(speedup: float, costs: ChainCosts, gamma: int) -> Optional[float]:
    """The least alpha, the same at every one of gamma positions, whose best k reaches `speedup`; None when even
    alpha = 1 does not (the costs alone forbid it). The best speedup rises with alpha, so bisection finds it."""
    def reach(alpha: float) -> float:
        return best_verify_len([alpha] * gamma, costs)[1]

    if reach(1.0) < speedup:
        return None
    low, high = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if reach(middle) < speedup else (low, middle)
    return high


def speedup_curve(costs: ChainCosts, gamma: int, points: int = 101) -> list[tuple[float, float]]:
    """(alpha, best expected speedup) for the same alpha at every position, alpha from 0 to 1."""
    return [(a, best_verify_len([a] * gamma, costs)[1]) for a in (i / (points - 1) for i in range(points))]


def speedup_report(acceptance: Sequence[float], reached: Sequence[int], costs: ChainCosts, gamma: int) -> dict:
    """What the costs allow and what a drafter's measured acceptance by position is expected to give. Only the
    positions before the first that fewer than MIN_REACHED verified drafts reached count (reached[j]: the rounds
    whose draft j + 1 was verified with every earlier one accepted; acceptance.acceptance_summary): a rate from a
    handful of rounds says little."""
    measured = [a for a, _ in itertools.takewhile(lambda pair: pair[1] >= MIN_REACHED, zip(acceptance, reached))]
    verify_len, speedup = best_verify_len(measured, costs) if measured else (0, None)
    return {"plain_round_s": costs.plain_s, "draft_s": costs.draft_s, "measured_acceptance": measured,
            "best_verify_len": verify_len, "expected_speedup": speedup,
            "acceptance_needed": {f"{s:g}x": acceptance_for(s, costs, gamma) for s in REPORTED_SPEEDUPS}}
