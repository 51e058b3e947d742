"""Draft-token sampling and the draft distribution it implies.

A draft token is drawn from q = softmax(logits / T). At T <= GREEDY_TEMPERATURE the draft is greedy: the
token is argmax(logits) and q is the one-hot of that token (DEEPSPEC_REFERENCE §3.2). The greedy and
sampled paths are separate functions; `sample_tokens` only dispatches.

RNG contract: sampled tokens come from `torch.multinomial` with the caller's `generator` (None = torch's
global generator; else it must live on the logits' device), one call per drafted position, so a fixed
generator seed reproduces a proposal.
"""
from typing import Optional

import torch
import torch.nn.functional as F

GREEDY_TEMPERATURE = 1e-5


def is_greedy(temperature: float) -> bool:
    return temperature <= GREEDY_TEMPERATURE


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    # logits: [bs, vocab] -> [bs] long
    return logits.argmax(dim=-1)


def sampled_tokens(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    # logits: [bs, vocab] -> [bs] long, one draw from softmax(logits / temperature) per row
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_tokens(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    # logits: [bs, vocab] -> [bs] long
    if is_greedy(temperature):
        return greedy_tokens(logits)
    return sampled_tokens(logits, temperature, generator)


def draft_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distribution q the tokens were drawn from. logits: [..., vocab] -> [..., vocab] float32."""
    if is_greedy(temperature):
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(logits.float() / temperature, dim=-1)
