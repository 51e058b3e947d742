"""Confidence calibration: predicted survival against the realised prefix acceptance, per draft position.

A round with verify length k gives, for each position j < k (0-based), the prediction
a_j = prod_{i<=j} sigma(c_i / t_i) (the survival: the estimated probability that d_1..d_{j+1} are all accepted)
and the label y_j = 1 if the target accepted d_1..d_{j+1}, else 0. Positions at or past k are unobserved.

Metrics (docs/evaluation.md): ECE over 20 equal-width bins, sum_b (n_b / N) |mean(a)_b - mean(y)_b|;
AUROC (probability that a random positive outranks a random negative, ties 1/2); Brier, mean (a - y)^2.
"""
from dataclasses import dataclass
from typing import List, Optional

import torch

ECE_BINS = 20
LIVE_WINDOW_ROWS = 4096  # request-rounds a served replica's live calibration window holds (integration/)
PREDICTION_CLAMP = 1e-8


@dataclass(frozen=True)
class CalibrationData:
    logits: torch.Tensor  # [rounds, gamma] raw confidence logits c_k
    accepted: torch.Tensor  # [rounds] long, drafts the target accepted
    verify_len: torch.Tensor  # [rounds] long, drafts verified

    @property
    def labels(self) -> torch.Tensor:  # [rounds, gamma] float, y_j
        return (torch.arange(self.logits.shape[1]) < self.accepted.unsqueeze(1)).double()

    @property
    def observed(self) -> torch.Tensor:  # [rounds, gamma] bool, j < verify_len
        return torch.arange(self.logits.shape[1]) < self.verify_len.unsqueeze(1)

    def survival(self, temperatures: Optional[torch.Tensor] = None) -> torch.Tensor:
        """a_j with per-position temperatures t (None: 1). -> [rounds, gamma] float64"""
        logits = self.logits.double() / (1.0 if temperatures is None else temperatures.double())
        return torch.sigmoid(logits).cumprod(dim=1).clamp(PREDICTION_CLAMP, 1 - PREDICTION_CLAMP)


def bin_index(pred: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """The equal-width bin on [0, 1] of each prediction (1.0 falls in the last bin)."""
    return (pred * bins).long().clamp(max=bins - 1)


def ece_rows(pred: torch.Tensor, label: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """ECE of every row of pred [rows, n] against label [n] at once -> [rows] float64.

    sum_b n_b/N |mean(a)_b - mean(y)_b| = sum_b |sum(a)_b - sum(y)_b| / N.
    """
    gap = torch.zeros(pred.shape[0], bins, dtype=torch.float64)
    gap.scatter_add_(1, bin_index(pred, bins), pred.double() - label.double())
    return gap.abs().sum(dim=1) / pred.shape[1]


def expected_calibration_error(pred: torch.Tensor, label: torch.Tensor, bins: int = ECE_BINS) -> float:
    """pred, label: [n] float; nan when empty."""
    return float(ece_rows(pred.unsqueeze(0), label, bins)[0]) if pred.numel() else float("nan")


def auroc(pred: torch.Tensor, label: torch.Tensor) -> float:
    """Mann-Whitney AUROC with ties counted 1/2; nan when only one class is present."""
    positives, negatives = int(label.sum()), int((1 - label).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    values, inverse = torch.unique(pred.double(), return_inverse=True)
    # Midranks of tied values: rank of a value = (first rank + last rank) / 2, 1-based.
    counts = torch.bincount(inverse, minlength=len(values)).double()
    ends = counts.cumsum(0)
    midrank = ends - (counts - 1) / 2
    rank_sum = float(midrank[inverse][label.bool()].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def per_position(data: CalibrationData, temperatures: Optional[torch.Tensor] = None) -> List[dict]:
    """ECE / AUROC / Brier / mean prediction / acceptance rate at each draft position (1-based `position`)."""
    survival, labels, observed = data.survival(temperatures), data.labels, data.observed
    rows = []
    for j in range(data.logits.shape[1]):
        pred, label = survival[observed[:, j], j], labels[observed[:, j], j]
        rows.append({
            "position": j + 1, "samples": int(pred.numel()),
            "ece": expected_calibration_error(pred, label), "auroc": auroc(pred, label),
            "brier": float(((pred - label) ** 2).mean()) if pred.numel() else float("nan"),
            "pred_mean": float(pred.mean()) if pred.numel() else float("nan"),
            "target_mean": float(label.mean()) if pred.numel() else float("nan"),
        })
    return rows


def mean_metric(rows: List[dict], key: str) -> float:
    """The sample-weighted mean of a per-position metric over positions that have samples (nan-free)."""
    used = [r for r in rows if r["samples"] and r[key] == r[key]]
    total = sum(r["samples"] for r in used)
    return sum(r[key] * r["samples"] for r in used) / total if total else float("nan")
