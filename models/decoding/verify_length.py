"""The engine's "allocate" step: how many of its gamma drafts each request sends to verification this round.

VerifyLengthPolicy holds one kernels/allocate.py policy and its settings (fixed, mtp1, threshold, causal =
paper Algorithm 1, lagged = paper §5.2) and calls `allocate_verify_lengths` with what the engine knows:
this round's confidences (STS-calibrated c_k; DSpark only), each request's remaining token budget as its max
length, and, for `lagged`, the confidences the same requests had one round earlier. Every policy reads only
drafter outputs and past rounds, never the target's verdict on this round, so decoding stays lossless
(kernels/verification.py): a policy only decides how many acceptance steps run.

Lagged history: a request with no earlier round (one that just joined) borrows the mean of the other requests'
lagged rows; when no request has history (the first round) that round runs `causal` (Algorithm 1), which is
lossless without any history.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from dspark.kernels.allocate import CONFIDENCE_POLICIES, allocate_verify_lengths
from dspark.kernels.sps import SpsTable


@dataclass(frozen=True)
class VerifyLengthPolicy:
    name: str = "fixed"
    sps: Optional[SpsTable] = None  # causal, lagged
    threshold: Optional[float] = None  # threshold
    threshold_on: str = "survival"  # threshold: "survival" or "confidence"
    length: Optional[int] = None  # fixed: drafts per request (None: gamma)
    min_length: int = 0
    max_batch_tokens: Optional[int] = None  # verify tokens per target forward, anchors included

    def __post_init__(self) -> None:
        one = torch.full((1, 1), 0.5)  # validates every setting now, with the allocator's own error messages
        self.lengths(one, one, max_length=torch.ones(1, dtype=torch.long))

    @property
    def needs_confidence(self) -> bool:
        return self.name in CONFIDENCE_POLICIES

    def lengths(self, confidence: torch.Tensor, lagged: Optional[torch.Tensor],
                max_length: torch.Tensor) -> torch.Tensor:
        """confidence [bs, gamma] (ones for a drafter without a confidence head), lagged [bs, gamma] or None
        (NaN rows: no history yet), max_length [bs] long -> [bs] long verify lengths."""
        name = self.name
        if name == "lagged":
            lagged = fill_history(lagged) if lagged is not None else None
            name = "causal" if lagged is None else name
        return allocate_verify_lengths(
            confidence, self.sps, name, lagged_confidence=lagged, threshold=self.threshold,
            threshold_on=self.threshold_on, length=self.length, min_length=self.min_length, max_length=max_length,
            max_batch_tokens=self.max_batch_tokens)


def fill_history(lagged: torch.Tensor) -> Optional[torch.Tensor]:
    """Rows without history (NaN) take the mean of the rows with history; None when no row has any."""
    missing = lagged.isnan().any(dim=1)
    if missing.all():
        return None
    if not missing.any():
        return lagged
    fill = lagged[~missing].mean(dim=0)
    return torch.where(missing[:, None], fill.expand_as(lagged), lagged)
