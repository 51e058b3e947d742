"""Sampling parameters and the one logits warping shared by the target, the drafters and verification.

warp(logits) = top-p(top-k(logits / T)): keep the k largest logits (k = 0: all), then the smallest set of tokens
whose probability reaches p (the most likely token always stays); everything else gets -inf. At
T <= GREEDY_TEMPERATURE decoding is greedy: the token is argmax(logits) and its distribution the one-hot of it.

Speculative sampling is lossless for *any* draft distribution q, as long as the q used in the acceptance test is
the one each draft token was drawn from. Warping q the same way as the target's p keeps q's mass on the tokens p
can emit, which raises acceptance; so drafters sample from `probs(logits, params)` too and report those logits.

RNG contract: one `torch.multinomial` per call with the caller's generator (None: torch's global one).
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE


GREEDY = SamplingParams()


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top_k logits (0 = all), then the smallest set whose probability reaches top_p; others -inf.

    logits: [..., vocab] (already divided by the temperature) -> [..., vocab].
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first token is always kept).
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The warped distribution. logits: [..., vocab] -> [..., vocab] float32 (one-hot of the argmax when greedy)."""
    if params.greedy:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits.float() / params.temperature, params.top_k, params.top_p), dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One token per row. logits: [bs, vocab] -> [bs] long."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return torch.multinomial(probs(logits, params), 1, generator=generator).squeeze(-1)
