"""A drafter's draft vocabulary in SGLang's DSpark worker: it drafts among those tokens only, as dspark's engine does.

A drafter directory may hold `draft_vocab.json` (models/drafters/draft_vocab.py): the tokens it drafts among in
dspark's engine, and for one trained with `--loss-over-draft-vocab` the only tokens it was trained to draft (its
Markov rows for the others are zeros: models/checkpoint.py). SGLang 0.5.23's DSpark worker knows nothing of it and
drafts over the whole vocabulary: the target's lm_head logits plus the Markov bias. Two hooks close the gap:

    load_weights          AFTER: reads the draft vocabulary beside the checkpoint SGLang loaded (its config's
                          directory) once, into a boolean mask on the drafter (None: no draft_vocab.json)
    compute_base_logits   AFTER: base logits outside the draft vocabulary become -inf, so greedy drafting picks,
                          and sampled drafting draws, only its tokens, with q renormalised over them

Both the eager proposal and the folded one (SGLang's draft sampler) take their base logits from
`compute_base_logits`, and the Markov bias is added to them, so every draft lies in the vocabulary and its q is the
engine's. Verification is exact whatever q is; this only makes the served drafts the ones the drafter was trained
and measured to make. Under a vocab-parallel draft head each rank masks its own slice.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from dspark.models.drafters.draft_vocab import load_draft_vocab

DRAFT_MODEL = "sglang.srt.models.dspark.DSparkDraftMixin"
MASK_ATTRIBUTE = "dspark_draft_vocab_mask"  # on the drafter module: [vocab_size] bool, or None
OUTSIDE_ATTRIBUTE = "dspark_draft_vocab_outside"  # on the drafter module: (start, width) -> [width] bool, per slice


def draft_vocab_mask(directory: Path, vocab_size: int, device) -> Optional[torch.Tensor]:
    """[vocab_size] True on the draft vocabulary stored beside the checkpoint in `directory`; None without one."""
    token_ids = load_draft_vocab(directory, vocab_size)
    if token_ids is None:
        return None
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[token_ids.to(device)] = True
    return mask


def outside_slice(mask: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """[width] True outside the draft vocabulary for the vocabulary slice from `start` (a rank's slice, or all of
    it); columns past the vocabulary (padding) count as outside."""
    inside = torch.zeros(width, dtype=torch.bool, device=mask.device)
    covered = max(0, min(width, mask.numel() - start))
    inside[:covered] = mask[start:start + covered]
    return ~inside


def refresh_mask(model) -> None:
    """The mask of the draft vocabulary beside the checkpoint the model's config names (at load, and after a
    drafter swap: drafter_swap.py)."""
    config = model.config
    directory = Path(getattr(config, "_name_or_path", "") or ".")
    device = next(model.parameters()).device
    setattr(model, MASK_ATTRIBUTE, draft_vocab_mask(directory, config.vocab_size, device))
    setattr(model, OUTSIDE_ATTRIBUTE, {})


def _after_load_weights(result, model, *args, **kwargs):
    refresh_mask(model)
    return result


def _after_compute_base_logits(result, model, *args, **kwargs):
    mask = getattr(model, MASK_ATTRIBUTE, None)
    if mask is None:
        return result
    logits, confidence_features = result
    shard = model.markov_head.vocab_shard
    key = (0 if shard is None else shard.start, logits.shape[-1])
    slices = getattr(model, OUTSIDE_ATTRIBUTE)
    if key not in slices:  # once per slice shape, not every round
        slices[key] = outside_slice(mask, *key)
    return logits.masked_fill(slices[key], float("-inf")), confidence_features


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{DRAFT_MODEL}.load_weights", _after_load_weights, HookType.AFTER)
    HookRegistry.register(f"{DRAFT_MODEL}.compute_base_logits", _after_compute_base_logits, HookType.AFTER)
