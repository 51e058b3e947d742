"""How many of its gamma drafts each request sends to verification this round.

A policy sees only the drafter's own outputs (the block and its confidences), never the target's verdict, so
any policy keeps decoding lossless (kernels/verification.py): it only decides how many acceptance steps run.
The engine then caps each length by the request's remaining token budget.

- FixedLength: every draft (gamma), or a fixed k <= gamma: the DeepSpec evaluation protocol.
- StaticThreshold: verify d_1..d_k while the survival a_k = prod_{i<=k} c_i (the estimated probability that
  d_1..d_k are all accepted) stays >= threshold; at least `min_length`. Needs a confidence head.
The confidence-aware allocator (paper Algorithm 1) plugs in here with the same signature.
"""
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from dspark.models.drafters.base import DraftBlock
from dspark.models.errors import ConfigError


class VerifyLengthPolicy(Protocol):
    needs_confidence: bool

    def __call__(self, block: DraftBlock, confidence: Optional[torch.Tensor]) -> torch.Tensor:
        """block.tokens [bs, gamma]; confidence [bs, gamma] (STS-calibrated c_k) or None -> [bs] long in [0, gamma]."""


@dataclass(frozen=True)
class FixedLength:
    length: Optional[int] = None  # None: the whole block
    needs_confidence = False

    def __post_init__(self) -> None:
        if self.length is not None and self.length < 0:
            raise ConfigError(f"fixed verify length must be >= 0, got {self.length}")

    def __call__(self, block: DraftBlock, confidence: Optional[torch.Tensor]) -> torch.Tensor:
        bs, gamma = block.tokens.shape
        length = gamma if self.length is None else min(self.length, gamma)
        return torch.full((bs,), length, dtype=torch.long, device=block.tokens.device)


@dataclass(frozen=True)
class StaticThreshold:
    threshold: float
    min_length: int = 0
    needs_confidence = True

    def __post_init__(self) -> None:
        if not 0 <= self.threshold <= 1:
            raise ConfigError(f"confidence threshold must lie in [0, 1], got {self.threshold}")
        if self.min_length < 0:
            raise ConfigError(f"min_length must be >= 0, got {self.min_length}")

    def __call__(self, block: DraftBlock, confidence: Optional[torch.Tensor]) -> torch.Tensor:
        if confidence is None:
            raise ConfigError("the static-threshold policy needs a drafter with a confidence head (DSpark)")
        survival = confidence.double().cumprod(dim=1)
        # survival is non-increasing, so the positions above the threshold form a prefix.
        length = (survival >= self.threshold).sum(dim=1)
        return length.clamp(min=min(self.min_length, block.tokens.shape[1]))
