"""Acceptance metrics pooled over all rounds of all requests (docs/evaluation.md), not per-sample means.

- tau = sum(tokens committed per round) / rounds: the accepted drafts plus the correction/bonus token (the
  paper's Table 1 metric; the first token, from the prefill, is not a round).
- cumulative acceptance at draft position k = #rounds with n >= k / #rounds that verified >= k drafts
  (DeepSpec's accept_rate@k-1: prefix survival).
- conditional acceptance at position k = #rounds with n >= k / #rounds with n >= k-1 that verified >= k drafts
  (the paper's Fig. 2); that denominator is `reached_by_position`, the evidence behind each rate.
- accepted-length histogram: entry n = #rounds that accepted n drafts (n = 0..gamma), i.e. committed n + 1
  tokens for one target forward (fewer only where EOS or max_new_tokens cut the round). It sums to the rounds,
  and sum(n * entry n) is the accepted drafts. A plain round (no drafter, or the drafting gate skipped it)
  counts at n = 0: it is a target forward that committed one token.
"""
from typing import Dict, List, Sequence

from dspark.models.decoding.engine import Generation, Round, tokens_per_round


def accepted_histogram(rounds: Sequence[Round], gamma: int) -> List[int]:
    """[gamma + 1] counts of rounds by drafts accepted (module docstring); the one place it is computed."""
    counts = [0] * (gamma + 1)
    for r in rounds:
        if not 0 <= r.accepted <= gamma:
            raise ValueError(f"a round accepted {r.accepted} drafts, outside 0..gamma={gamma}: pass the drafter's "
                             "gamma (0 only without a drafter)")
        counts[r.accepted] += 1
    return counts


def acceptance_summary(generations: Sequence[Generation], gamma: int) -> Dict:
    rounds = [r for g in generations for r in g.rounds]
    n_rounds = len(rounds)
    cumulative, conditional, reached_counts = [], [], []
    for k in range(1, gamma + 1):
        verified = [r for r in rounds if r.verify_len >= k]
        reached = [r for r in verified if r.accepted >= k - 1]
        passed = sum(r.accepted >= k for r in verified)
        cumulative.append(passed / len(verified) if verified else float("nan"))
        conditional.append(passed / len(reached) if reached else float("nan"))
        reached_counts.append(len(reached))
    return {
        "tau": tokens_per_round(generations),
        "rounds": n_rounds,
        "mean_verify_len": sum(r.verify_len for r in rounds) / n_rounds if n_rounds else float("nan"),
        "generated_tokens": sum(len(g.token_ids) for g in generations),
        "accepted_drafts": sum(r.accepted for r in rounds),
        "accepted_histogram": accepted_histogram(rounds, gamma),
        "cumulative_acceptance": cumulative,
        "conditional_acceptance": conditional,
        "reached_by_position": reached_counts,
    }


def calibration_rounds(generations: Sequence[Generation]) -> List:
    """(confidence logits, accepted, verify_len) of every round that has confidences."""
    return [(r.confidence_logits, r.accepted, r.verify_len) for g in generations for r in g.rounds
            if r.confidence_logits is not None]
