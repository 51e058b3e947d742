"""The draft vocabulary: the tokens a drafter may propose, and its vocabulary heads restricted to them.

A drafting pass of a small target is dominated by the full-vocabulary products: the lm_head over gamma positions
and, for DSpark, gamma Markov-bias products W2 z. On SmolLM2-135M (49,152 tokens) they were 11 of the 21 ms a
DSpark pass took on two AVX2 cores, while the target's replies to 2,880 training prompts (184k tokens) used
fewer than 8,192 distinct tokens. Drafting over the most frequent tokens of such replies (as EAGLE-3's draft
vocabulary and FR-Spec do) makes those products proportionally cheaper.

Verification stays exact. Greedy: a draft is accepted only where it equals the target's argmax, whatever the
drafter could propose. Sampled: the drafts are drawn from q = softmax over the draft vocabulary, and DraftBlock
hands verification that same q scattered into the full vocabulary (0 elsewhere), so the rejection sampler's
residual max(p - q, 0) covers the tokens the drafter cannot propose. The cost is acceptance at positions whose
target token lies outside the draft vocabulary.

A drafter checkpoint directory may hold `draft_vocab.json` (`dspark train` writes it from its training replies;
`--only-draft-vocab` writes it alone for a drafter trained before; a fine-tune, `--init-from-drafter`, keeps the
vocabulary of the drafter it starts from whole and adds the new replies' most frequent tokens up to the size):

    {"token_ids": [...],        sorted, distinct, each < the target's vocab_size
     "source": "...",           what was counted
     "counted_tokens": 184320,  how many
     "coverage": 1.0}           the share of the counted tokens inside the vocabulary
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from dspark.models.errors import CheckpointError
from dspark.models.jsonl import read_json_file

DRAFT_VOCAB_FILE = "draft_vocab.json"
MAX_DRAFT_VOCAB_BYTES = 64 << 20  # every id of a 1M-token vocabulary, with room


class DraftVocab(nn.Module):
    """token_ids [V'] (sorted, distinct) and copies of the lm_head rows (and Markov W2 rows) of those tokens."""

    def __init__(self, token_ids: torch.Tensor, lm_head: nn.Linear, markov_w2: Optional[torch.Tensor] = None):
        super().__init__()
        self.vocab_size = lm_head.out_features
        self.register_buffer("token_ids", token_ids.to(lm_head.weight.device), persistent=False)
        self.head = nn.Linear(lm_head.in_features, len(token_ids), bias=False).requires_grad_(False)
        self.head.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)
        with torch.no_grad():
            self.head.weight.copy_(lm_head.weight[self.token_ids])
        self.register_buffer("markov_w2", None if markov_w2 is None else markov_w2.detach()[self.token_ids].contiguous(),
                             persistent=False)

    def full_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., V'] probabilities over the draft vocabulary -> [..., vocab_size], 0 outside it."""
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        return full.index_copy_(-1, self.token_ids, probs)


def most_frequent(token_ids: torch.Tensor, vocab_size: int, size: int,
                  keep: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, float]:
    """(the `size` most frequent of token_ids' values, sorted; the share of token_ids they cover). Fewer when
    fewer distinct values occur; ties broken towards the smaller id.

    keep: token ids that stay in whole (a fine-tuned drafter's vocabulary, whose rows are already trained); the
    most frequent of the other values fill what is left of `size`, if anything."""
    if size < 1:
        raise ValueError(f"a draft vocabulary needs at least one token, asked for {size}")
    counts = torch.bincount(token_ids.flatten(), minlength=vocab_size)
    kept = torch.empty(0, dtype=torch.long) if keep is None else keep.to(torch.long)
    candidates = counts.index_fill(0, kept, 0)
    order = torch.sort(candidates, descending=True, stable=True).indices[:max(0, size - len(kept))]
    chosen = torch.cat([kept, order[candidates[order] > 0]]).sort().values
    return chosen, counts[chosen].sum().item() / max(1, token_ids.numel())


def save_draft_vocab(directory: Path, token_ids: torch.Tensor, source: str, counted_tokens: int,
                     coverage: float) -> Path:
    path = Path(directory) / DRAFT_VOCAB_FILE
    path.write_text(json.dumps({"token_ids": token_ids.tolist(), "source": source, "counted_tokens": counted_tokens,
                                "coverage": round(coverage, 6)}) + "\n")
    return path


def load_draft_vocab(directory: Path, vocab_size: int) -> Optional[torch.Tensor]:
    """The draft vocabulary stored beside a drafter ([V'] long), or None when it has none; CheckpointError
    naming the file for a malformed one."""
    path = Path(directory) / DRAFT_VOCAB_FILE
    if not path.exists():
        return None
    kind = 'a draft vocabulary ({"token_ids": [...]})'
    raw = read_json_file(path, str(path), kind, MAX_DRAFT_VOCAB_BYTES, error=CheckpointError)
    if not isinstance(raw, dict) or "token_ids" not in raw:
        raise CheckpointError(f"{path} is not {kind}")
    ids = raw["token_ids"]
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        raise CheckpointError(f"{path}: token_ids must be a non-empty list of integers")
    if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0 or ids[-1] >= vocab_size:
        raise CheckpointError(f"{path}: token_ids must be sorted, distinct and in [0, {vocab_size}) (the target's "
                              f"vocab_size), got {len(ids)} ids from {min(ids)} to {max(ids)}")
    return torch.tensor(ids, dtype=torch.long)
