"""Anchor sampling for the block drafters (DSpark, DFlash): which blocks of a sequence are trained.

A training block starts at an anchor position p. Its γ input slots are [x_p, MASK, ..., MASK] at positions
p .. p+γ-1 and output slot k (0-indexed) is trained to predict x_{p+k+1}; the drafter's context is the target
features at positions 0 .. p-1 (docs/training.md).

Algorithm (DeepSpec's):
  1. candidates: p in [0, seq-2] with loss_mask[p] and loss_mask[p+1] (the anchor is a response token and so is
     its first label);
  2. draw up to n_anchors candidates uniformly without replacement (random keys, invalid positions get a key
     above every valid one, take the smallest n_anchors) and sort them ascending;
  3. a sequence with fewer candidates than n_anchors fills the remaining slots with dummy blocks: anchor 0,
     block_keep False, never supervised;
  4. eval_mask[k] = block_keep and p+k+1 < seq and loss_mask[p+k+1], then a cumulative product along k, so only
     a contiguous valid prefix of a block is supervised (the last response tokens yield shortened blocks).

Invariants: kept anchors are strictly increasing and come before every dummy block (block_keep is a prefix of
True values); eval_mask[..., 0] equals block_keep; eval_mask never turns back on along k.

RNG contract: all randomness comes from the `generator` argument (a CPU torch.Generator); the same generator
state and inputs give the same anchors on every device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Key given to positions that cannot be anchors; valid candidates draw keys in [0, 1).
_INVALID_KEY = 2.0
# Anchor position of a dummy (padding) block; it is never attended to or supervised.
DUMMY_ANCHOR = 0


@dataclass(frozen=True)
class AnchorBatch:
    """The sampled blocks of one micro-batch and their supervision targets."""

    anchors: torch.Tensor  # [bs, n_anchors] long, anchor position p of each block
    block_keep: torch.Tensor  # [bs, n_anchors] bool, False for dummy blocks
    labels: torch.Tensor  # [bs, n_anchors, gamma] long, x_{p+k+1} (0 past the end of the sequence)
    eval_mask: torch.Tensor  # [bs, n_anchors, gamma] bool, supervised slots (contiguous prefix per block)

    @property
    def positions(self) -> torch.Tensor:
        """[bs, n_anchors, gamma] long: p+k, the sequence position whose target distribution slot k imitates."""
        gamma = self.labels.shape[-1]
        return self.anchors.unsqueeze(-1) + torch.arange(gamma, device=self.anchors.device)


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions that may anchor a block.

    loss_mask: [bs, seq] bool/int, True on response (trained) tokens.
    Returns [bs, seq] bool: loss_mask[p] and loss_mask[p+1]; always False at the last position.
    """
    mask = loss_mask.bool()
    candidates = torch.zeros_like(mask)
    candidates[:, :-1] = mask[:, :-1] & mask[:, 1:]
    return candidates


def sample_anchors(
    loss_mask: torch.Tensor,  # [bs, seq]
    n_anchors: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw up to n_anchors anchors per sequence, uniformly without replacement among the candidates.

    Returns (anchors [bs, n_anchors] long, block_keep [bs, n_anchors] bool), both on loss_mask's device. Kept
    anchors are ascending and precede the dummy blocks (anchor DUMMY_ANCHOR, block_keep False).
    """
    if n_anchors < 1:
        raise ValueError(f"n_anchors must be >= 1, got {n_anchors}")
    candidates = anchor_candidates(loss_mask).cpu()
    bs, seq = candidates.shape
    keys = torch.rand(bs, seq, generator=generator)
    keys = torch.where(candidates, keys, torch.full_like(keys, _INVALID_KEY))
    n_drawn = min(n_anchors, seq)
    drawn_keys, drawn_pos = torch.topk(keys, n_drawn, dim=1, largest=False)
    keep = drawn_keys < _INVALID_KEY
    # Sort kept anchors ascending; dummies get a sort key past every real position so they stay at the end.
    order_key = torch.where(keep, drawn_pos, torch.full_like(drawn_pos, seq))
    order_key, order = torch.sort(order_key, dim=1)
    keep = torch.gather(keep, 1, order)
    anchors = torch.where(keep, order_key, torch.full_like(order_key, DUMMY_ANCHOR))
    if n_drawn < n_anchors:
        pad = n_anchors - n_drawn
        anchors = torch.cat([anchors, anchors.new_full((bs, pad), DUMMY_ANCHOR)], dim=1)
        keep = torch.cat([keep, keep.new_zeros((bs, pad))], dim=1)
    return anchors.to(loss_mask.device), keep.to(loss_mask.device)


def block_targets(
    input_ids: torch.Tensor,  # [bs, seq] long
    loss_mask: torch.Tensor,  # [bs, seq]
    anchors: torch.Tensor,  # [bs, n_anchors] long
    block_keep: torch.Tensor,  # [bs, n_anchors] bool
    gamma: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and supervision mask of each block.

    Returns (labels [bs, n_anchors, gamma] long = x_{p+k+1}, 0 where p+k+1 >= seq;
             eval_mask [bs, n_anchors, gamma] bool = cumprod_k(block_keep and p+k+1 < seq and loss_mask[p+k+1])).
    """
    seq = input_ids.shape[1]
    label_pos = anchors.unsqueeze(-1) + 1 + torch.arange(gamma, device=anchors.device)  # [bs, n, gamma]
    in_range = label_pos < seq
    safe_pos = label_pos.clamp(max=seq - 1).flatten(1)  # [bs, n*gamma]
    labels = torch.gather(input_ids, 1, safe_pos).view_as(label_pos)
    labels = torch.where(in_range, labels, torch.zeros_like(labels))
    label_trained = torch.gather(loss_mask.bool(), 1, safe_pos).view_as(label_pos)
    valid = in_range & label_trained & block_keep.unsqueeze(-1)
    eval_mask = torch.cumprod(valid.int(), dim=-1).bool()
    return labels, eval_mask


def sample_blocks(
    input_ids: torch.Tensor,  # [bs, seq] long
    loss_mask: torch.Tensor,  # [bs, seq]
    n_anchors: int,
    gamma: int,
    generator: torch.Generator,
) -> AnchorBatch:
    """Sample anchors and build their labels and supervision mask in one call."""
    anchors, block_keep = sample_anchors(loss_mask, n_anchors, generator)
    labels, eval_mask = block_targets(input_ids, loss_mask, anchors, block_keep, gamma)
    return AnchorBatch(anchors=anchors, block_keep=block_keep, labels=labels, eval_mask=eval_mask)
