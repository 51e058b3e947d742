"""DSpark Markov heads: a low-rank bias on each draft position's logits from the previous token.

Base logits U_k = lm_head(h_k), with h_k the final-normed backbone hidden state of draft position k.
prev_0 = anchor, prev_k = the token at draft position k - 1 (docs/training.md). With W1 = Embedding(V, r)
and W2 = Linear(r, V, no bias):
- vanilla: logits_k = U_k + W2(W1[prev_k])
- gated:   g_k = sigmoid(gate_proj([h_k ; W1[prev_k]])), logits_k = U_k + W2(g_k * W1[prev_k])
- rnn:     [g, c, o] = joint_proj([s_{k-1} ; W1[prev_k] ; h_k]), s_k = sigmoid(g) s_{k-1} + (1 - sigmoid(g)) tanh(c),
           logits_k = U_k + W2(tanh(o)), s_0 = 0
Each head computes a code z_k [rank] (`step_code`: W1[prev_k], g_k * W1[prev_k], tanh(o)); the bias is W2 z_k.
Training is teacher-forced (`block_logits`: prev = data tokens); drafting is sequential (`sample_block`: prev =
the token just drawn, one `kernels.markov.markov_sample_step` per position: bias, logits and the draw, a Triton
kernel on GPU). Both run the same `step_code`, so for the same tokens they give the same logits.
Parameter names (markov_w1, markov_w2, gate_proj, joint_proj) are SGLang 0.5.23's checkpoint names.
"""
from abc import ABC, abstractmethod
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from dspark.kernels.markov import markov_sample_step
from dspark.kernels.warping import SamplingParams
from dspark.models.drafters.draft_vocab import DraftVocab


class MarkovHead(nn.Module, ABC):
    stateful = False

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def prev_embedding(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        # prev_tokens: [...] long -> [..., rank]
        return self.markov_w1(prev_tokens)

    def initial_state(self, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        # hidden: [..., hidden] of one position; stateless heads carry nothing
        return None

    @abstractmethod
    def step_code(self, prev_tokens: torch.Tensor, hidden: torch.Tensor,
                  state: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """prev_tokens [...], hidden [..., hidden] -> (code z [..., rank], next state)."""

    def block_logits(self, base_logits: torch.Tensor, hidden: torch.Tensor, prev_tokens: torch.Tensor,
                     vocab_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Teacher-forced correction of a whole block.

        base_logits: [..., gamma, vocab] (or [..., gamma, V'] over the tokens vocab_ids [V'], whose W2 rows then
        give the bias); hidden: [..., gamma, hidden]; prev_tokens: [..., gamma] long (prev_tokens[..., 0] is the
        anchor). Returns [..., gamma, vocab or V'].
        """
        w2 = self.markov_w2.weight if vocab_ids is None else self.markov_w2.weight[vocab_ids]
        if not self.stateful:  # every position is independent given its prev token: one batched call
            code, _ = self.step_code(prev_tokens, hidden, None)
            return base_logits + F.linear(code, w2)
        state = self.initial_state(hidden[..., 0, :])
        codes = []
        for k in range(prev_tokens.shape[-1]):
            code, state = self.step_code(prev_tokens[..., k], hidden[..., k, :], state)
            codes.append(code)
        return base_logits + F.linear(torch.stack(codes, dim=-2), w2)

    def sample_block(self, base_logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor,
                     sampling: SamplingParams, generator: Optional[torch.Generator],
                     vocab: Optional[DraftVocab] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Draft left to right, each token feeding the next position's bias.

        base_logits: [bs, gamma, vocab] (or [bs, gamma, V'] over the draft vocabulary `vocab`, whose W2 rows
        then give the bias); hidden: [bs, gamma, hidden]; anchor: [bs] long.
        Returns tokens [bs, gamma] long and the corrected logits [bs, gamma, vocab or V'] they were drawn from.
        """
        w2 = self.markov_w2.weight if vocab is None else vocab.markov_w2
        state = self.initial_state(hidden[:, 0])
        prev = anchor
        tokens, logits = [], []
        for k in range(base_logits.shape[1]):
            code, state = self.step_code(prev, hidden[:, k], state)
            index, step_logits = markov_sample_step(base_logits[:, k], code, w2, sampling, generator)
            prev = index if vocab is None else vocab.token_ids[index]
            tokens.append(prev)
            logits.append(step_logits)
        return torch.stack(tokens, dim=1), torch.stack(logits, dim=1)


class VanillaMarkovHead(MarkovHead):
    def step_code(self, prev_tokens, hidden, state):
        return self.prev_embedding(prev_tokens), state


class GatedMarkovHead(MarkovHead):
    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def step_code(self, prev_tokens, hidden, state):
        prev = self.prev_embedding(prev_tokens)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, prev], dim=-1)))
        return gate * prev, state


class RNNMarkovHead(MarkovHead):
    stateful = True

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)
        self.rank = rank
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def initial_state(self, hidden):
        return hidden.new_zeros(hidden.shape[:-1] + (self.rank,))

    def step_code(self, prev_tokens, hidden, state):
        z = torch.cat([state, self.prev_embedding(prev_tokens), hidden], dim=-1)
        gate_raw, candidate_raw, output_raw = self.joint_proj(z).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
        return torch.tanh(output_raw), state


def build_markov_head(head_type: str, vocab_size: int, rank: int, hidden_size: int) -> MarkovHead:
    """head_type is one of config.MARKOV_HEAD_TYPES (validated by DrafterConfig)."""
    if head_type == "vanilla":
        return VanillaMarkovHead(vocab_size, rank)
    head_class = {"gated": GatedMarkovHead, "rnn": RNNMarkovHead}[head_type]
    return head_class(vocab_size, rank, hidden_size)
