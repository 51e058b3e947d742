"""The sampling penalties of a verify window, position by position: what each decode step would apply, for all
of the window's positions at once.

A decode step that draws output token t of a request scores the vocabulary with the target's logits l and the
request's penalties over the output tokens o_0..o_{t-1} drawn before it (prompt tokens do not count, as in SGLang).
With c[v] = #{i < t : o_i = v}, each penalty is one step on the logits:

    frequency f        l[v] -= f * c[v]
    presence p         l[v] -= p * [c[v] > 0]
    min_new_tokens m   l[v] = -inf for every stop token v while t < m
    repetition r       l[v] = l[v] * r if l[v] < 0 else l[v] / r, for every v with c[v] > 0

The steps do not commute (repetition scales what the additive steps left), so they run in one order, PENALTIES.
Then logit_bias is added: SGLang adds it after the
grammar mask, which only writes -inf, so the order against the mask is moot.

A verify window of width W holds the anchor (the last committed token) and the drafts d_1..d_{W-1}. Its row j
scores the token after d_j as though d_1..d_j had been accepted: output position t = n + j (n committed output
tokens) with counts c_j = c + onehot(d_1) + ... + onehot(d_j). A row is only read when every draft before it was
accepted, so each row sees exactly the history a decode step would see at that position, and verifying against
these rows is lossless for penalised requests too. Applying row 0's penalties to every row (what SGLang's DSpark
and EAGLE workers do) is not: a token drafted at position 1 goes unpenalised at position 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

# The order penalties apply in: the additive ones, then the scaling (SGLang's overlapped decode's order; the plugin
# makes its non-overlapped decode keep it too: integration/verify_penalties.py).
PENALTIES = ("frequency", "min_new_tokens", "presence", "repetition")


@dataclass(frozen=True)
class WindowPenalties:
    """Per-request penalty parameters for R requests over a vocabulary of V tokens."""
    frequency: torch.Tensor  # [R] float32 (0: off)
    presence: torch.Tensor  # [R] float32 (0: off)
    repetition: torch.Tensor  # [R] float32 (1: off)
    min_new_tokens: torch.Tensor  # [R] long (0: off)
    stop_tokens: torch.Tensor  # [R, V] bool: the tokens min_new_tokens holds back
    logit_bias: Optional[torch.Tensor] = None  # [R, V] float32, or None


def window_counts(history_counts: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """Occurrences of each token before each row of the window.

    history_counts: [R, V] float32, the committed output's counts; drafts: [R, W-1] long -> [R, W, V] float32,
    where row j adds d_1..d_j.
    """
    rows, width = drafts.shape[0], drafts.shape[1] + 1
    counts = history_counts[:, None, :].repeat(1, width, 1)  # [R, W, V]
    if width == 1:
        return counts
    # earlier[j, i] = 1 when draft i (0-based, d_{i+1}) comes before row j, i.e. i < j.
    earlier = torch.ones(width, width - 1, device=drafts.device).tril(-1)  # [W, W-1]
    index = drafts[:, None, :].expand(rows, width, width - 1)  # [R, W, W-1]
    return counts.scatter_add_(2, index, earlier[None].expand(rows, -1, -1).to(counts.dtype))


def apply_window_penalties(logits: torch.Tensor, history_counts: torch.Tensor, drafts: torch.Tensor,
                           output_lens: torch.Tensor, penalties: WindowPenalties) -> None:
    """Penalise a verify window's logits in place, one penalty after another in PENALTIES' order (module
    docstring), then add the logit_bias.

    logits: [R, W, V] float; history_counts: [R, V] float32; drafts: [R, W-1] long; output_lens: [R] long, the
    committed output tokens n of each request.
    """
    rows, width, vocab = logits.shape
    if drafts.shape != (rows, width - 1) or history_counts.shape != (rows, vocab) or output_lens.shape != (rows,):
        raise ValueError(f"window of {tuple(logits.shape)} logits: drafts {tuple(drafts.shape)}, history counts "
                         f"{tuple(history_counts.shape)} and output lengths {tuple(output_lens.shape)} do not fit")
    counts = window_counts(history_counts, drafts)  # [R, W, V]
    seen = counts > 0
    for penalty in PENALTIES:
        if penalty == "frequency":
            logits.sub_((penalties.frequency[:, None, None] * counts).to(logits.dtype))
        elif penalty == "presence":
            logits.sub_((penalties.presence[:, None, None] * seen).to(logits.dtype))
        elif penalty == "min_new_tokens":
            positions = output_lens[:, None] + torch.arange(width, device=logits.device)  # [R, W]: t of each row
            held_back = (positions < penalties.min_new_tokens[:, None])[:, :, None] & penalties.stop_tokens[:, None]
            logits.masked_fill_(held_back, float("-inf"))
        else:
            scale = torch.where(seen, penalties.repetition[:, None, None], 1.0).to(logits.dtype)  # [R, W, V]
            logits.copy_(torch.where(logits < 0, logits * scale, logits / scale))
    if penalties.logit_bias is not None:
        logits.add_(penalties.logit_bias[:, None, :].to(logits.dtype))
