"""DSpark confidence head: c_k = sigmoid(proj(feat_k)), the probability that draft token k is accepted
given that tokens before it were (a conditional rate; the prefix survival is the cumulative product).

feat_k = [h_k ; W1[prev_k]] when `with_markov` (prev_0 = anchor, prev_k = draft token k - 1, W1 = the Markov
head's embedding, shared and not detached), else h_k alone; h_k is the final-normed backbone hidden state
(docs/training.md). The head returns logits; callers apply the sigmoid. `proj` is SGLang's name.
"""
from typing import Optional

import torch
from torch import nn


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, markov_rank: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (markov_rank if with_markov else 0), 1)

    def forward(self, hidden: torch.Tensor, prev_embedding: Optional[torch.Tensor]) -> torch.Tensor:
        # hidden: [..., hidden]; prev_embedding: [..., rank] (used iff with_markov) -> logits [...]
        features = torch.cat([hidden, prev_embedding], dim=-1) if self.with_markov else hidden
        return self.proj(features).squeeze(-1)
