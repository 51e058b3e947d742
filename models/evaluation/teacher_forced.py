"""Teacher-forced greedy acceptance on the target's own greedy replies to evaluation prompts.

It tells what the drafter knows of this text apart from what the decoding loop makes of it. The target answers
each prompt greedily (plain decoding); training/evaluate.py's `greedy_acceptance` then counts, at every anchor
inside each reply, how many drafts greedy verification would accept. When the engine's greedy τ (every draft
verified) is about this τ, the loop loses nothing, and a shortfall against the drafter's held-out τ is its fit
to these prompts. (SmolLM2 DSpark on 6 mt-bench prompts: 1.22 teacher-forced, 1.20 decoded; 1.90 on its own
held-out prompts.)
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from dspark.kernels.warping import GREEDY
from dspark.models.decoding.engine import Generation, GenerationConfig, SpeculativeDecoder
from dspark.models.drafters.base import Drafter
from dspark.models.training.data import TokenDataset
from dspark.models.training.evaluate import AcceptanceReport, greedy_acceptance


def replies_dataset(generations: Sequence[Generation]) -> TokenDataset:
    """Prompt + reply per row, right-padded; the loss mask (where anchors may lie) covers the reply."""
    width = max(len(g.prompt_ids) + len(g.token_ids) for g in generations)
    input_ids = torch.zeros(len(generations), width, dtype=torch.long)
    reply = torch.zeros(len(generations), width, dtype=torch.bool)
    present = torch.zeros_like(reply)
    for row, g in enumerate(generations):
        tokens = list(g.prompt_ids) + list(g.token_ids)
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        present[row, : len(tokens)] = True
        reply[row, len(g.prompt_ids): len(tokens)] = True
    return TokenDataset(input_ids, reply, present)


def teacher_forced_acceptance(target: torch.nn.Module, drafter: Drafter, prompts: Sequence[List[int]],
                              max_new_tokens: int, eos_token_ids: tuple, batch_size: int = 4) -> AcceptanceReport:
    """The drafter's teacher-forced greedy acceptance on the target's greedy replies to `prompts`, drafting among
    its draft vocabulary when it has one (as decoding does)."""
    config = GenerationConfig(max_new_tokens, GREEDY, eos_token_ids)
    plain = SpeculativeDecoder(target)
    replies = [g for start in range(0, len(prompts), batch_size)
               for g in plain.generate(prompts[start:start + batch_size], config)]
    vocab_ids = None if drafter.draft_vocab is None else drafter.draft_vocab.token_ids
    return greedy_acceptance(drafter, target, replies_dataset(replies), drafter.config.target_layer_ids, batch_size,
                             vocab_ids)
