"""The engine's "allocate" step: how many of its gamma drafts each request sends to verification this round.

VerifyLengthPolicy compiles the verify-plan settings (settings.py: the policy, its threshold, the verify length
limits, the budget fraction, the token cap) with the SPS table into calls of kernels/allocate.py, fed with what
the engine knows: this round's confidences (STS-calibrated c_k; DSpark only), each request's remaining token
budget, and, for `lagged`, the confidences the same requests had one round earlier. Every policy reads only
drafter outputs and past rounds, never the target's verdict on this round, so decoding stays lossless
(kernels/verification.py): a policy only decides how many acceptance steps run.

Limits, for every policy: request r verifies at most min(max_verify_length, its remaining budget) drafts (the
fixed policy exactly that many) and at least min_verify_length of them; a forward carries at most
max_batch_tokens tokens and, with budget_fraction, at most R + budget_fraction * R * gamma.

Lagged history: a request with no earlier round (one that just joined) borrows the mean of the other requests'
lagged rows; when no request has history (the first round) that round runs `causal` (Algorithm 1), which is
lossless without any history.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from dspark.kernels.allocate import allocate_verify_lengths
from dspark.kernels.sps import SpsTable
from dspark.models.decoding.settings import CONFIDENCE_POLICIES, SGLANG_POLICY, SPS_POLICIES, VerifySettings
from dspark.models.errors import ConfigError


@dataclass(frozen=True)
class VerifyLengthPolicy:
    settings: VerifySettings = VerifySettings(policy="fixed")
    sps: Optional[SpsTable] = None  # causal, lagged

    def __post_init__(self) -> None:
        if self.name == SGLANG_POLICY:
            raise ConfigError("policy 'sglang' is SGLang's own planner: it exists only in `dspark serve`")
        if self.name in SPS_POLICIES and self.sps is None:
            raise ConfigError(f"the {self.name} policy needs an SPS table (--sps-table; `dspark profile-sps` "
                              "writes one)")

    @classmethod
    def of(cls, policy: str = "fixed", sps: Optional[SpsTable] = None, **settings) -> "VerifyLengthPolicy":
        """Shorthand: VerifyLengthPolicy.of("threshold", threshold=0.3)."""
        return cls(VerifySettings(policy=policy, **settings), sps)

    @property
    def name(self) -> str:
        return self.settings.policy

    @property
    def needs_confidence(self) -> bool:
        return self.name in CONFIDENCE_POLICIES

    def with_sps(self, sps: SpsTable) -> "VerifyLengthPolicy":
        return replace(self, sps=sps)

    def lengths(self, confidence: torch.Tensor, lagged: Optional[torch.Tensor],
                max_length: torch.Tensor) -> torch.Tensor:
        """confidence [bs, gamma] (ones for a drafter without a confidence head), lagged [bs, gamma] or None
        (NaN rows: no history yet), max_length [bs] long (remaining budgets) -> [bs] long verify lengths."""
        s, name = self.settings, self.name
        requests, gamma = confidence.shape
        if name == "lagged":
            lagged = fill_history(lagged) if lagged is not None else None
            name = "causal" if lagged is None else name
        if s.max_verify_length is not None:
            max_length = max_length.clamp(max=s.max_verify_length)
        token_caps = [s.max_batch_tokens]
        if s.budget_fraction is not None:
            token_caps.append(requests + int(s.budget_fraction * requests * gamma))
        caps = [c for c in token_caps if c is not None]
        return allocate_verify_lengths(
            confidence, self.sps, name, lagged_confidence=lagged, threshold=s.threshold,
            threshold_on=s.threshold_on, min_length=s.min_verify_length, max_length=max_length,
            max_batch_tokens=min(caps) if caps else None)


def fill_history(lagged: torch.Tensor) -> Optional[torch.Tensor]:
    """Rows without history (NaN) take the mean of the rows with history; None when no row has any."""
    missing = lagged.isnan().any(dim=1)
    if missing.all():
        return None
    if not missing.any():
        return lagged
    fill = lagged[~missing].mean(dim=0)
    return torch.where(missing[:, None], fill.expand_as(lagged), lagged)
