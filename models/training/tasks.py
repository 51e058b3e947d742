"""What one training micro-batch computes for each drafter family, given the frozen target's outputs.

- BlockTask (DSpark, DFlash): sample anchor blocks (anchors.py), run the drafter's teacher-forced block forward
  with the target features as context, and score it with block_loss against the data tokens and the target's
  next-token distribution at p+k (losses.py).
- Eagle3Task: run the drafter's test-time-training unroll over every position and score it with eagle3_loss.

Target outputs come from a target forward per micro-batch or from the feature cache: the concatenated hidden states
of the tapped layers (the output of decoder layer l, as SGLang captures it) and the last post-norm hidden state,
whose lm_head gives the target's logits = the p_t of the losses, at the positions a loss reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from dspark.models.target_features import capture_target_features
from dspark.models.training.anchors import sample_blocks
from dspark.models.training.data import TokenDataset
from dspark.models.training.losses import (
    BlockLossWeights,
    LossTerms,
    block_loss,
    eagle3_loss,
    eagle3_target_positions,
    eagle3_valid_mask,
    position_weights,
)

Reduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TargetOutputs:
    hidden: torch.Tensor  # [bs, seq, n_taps*hidden] tapped layer outputs, in target_layer_ids order
    last_hidden: torch.Tensor  # [bs, seq, hidden] the post-final-norm hidden state
    lm_head: torch.nn.Module  # the target's frozen output embedding

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        """The target's next-token logits at every position: [bs, seq, vocab]."""
        return self.lm_head(self.last_hidden)

    @torch.no_grad()
    def distinct_logits(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits at `positions` (indices into the flattened [bs·seq] positions, any shape), each distinct one
        once -> ([rows, vocab] logits, each position's row, shaped as `positions`). The rows are picked before the
        head: a vocabulary-wide row is 85x a hidden row (SmolLM2), and a loss reads each response position several
        times (block slots overlap; Eagle3's steps read their neighbours' positions)."""
        distinct, row = torch.unique(positions, return_inverse=True)
        return self.lm_head(self.last_hidden.flatten(0, 1)[distinct]), row


@torch.no_grad()
def target_outputs(target: torch.nn.Module, batch: TokenDataset, layer_ids: tuple[int, ...]) -> TargetOutputs:
    """One frozen target forward over the batch: tapped features and the last post-norm hidden state."""
    features = capture_target_features(target, batch.input_ids, layer_ids, attention_mask=batch.attention_mask.long())
    return TargetOutputs(features.hidden, features.last_hidden, target.get_output_embeddings())


class TrainTask(Protocol):
    target_layer_ids: tuple[int, ...]

    def loss(
        self,
        model: torch.nn.Module,
        batch: TokenDataset,
        target: TargetOutputs,
        generator: torch.Generator,
        reduce: Reduce,
    ) -> LossTerms:
        """The micro-batch loss; `model(**kw)` runs drafter.forward_train; `reduce` sums a tensor over ranks."""


@dataclass(frozen=True)
class BlockTask:
    """DSpark / DFlash: anchor blocks of `gamma` slots, `n_anchors` per sequence; with `vocab_ids`, the drafter's
    logits and the loss cover only that draft vocabulary (losses.py)."""

    target_layer_ids: tuple[int, ...]
    gamma: int
    n_anchors: int
    weights: BlockLossWeights
    vocab_ids: torch.Tensor | None = None  # [V'] sorted token ids

    def loss(self, model, batch, target, generator, reduce) -> LossTerms:
        blocks = sample_blocks(batch.input_ids, batch.loss_mask, self.n_anchors, self.gamma, generator)
        vocab_ids = None if self.vocab_ids is None else self.vocab_ids.to(batch.input_ids.device)
        out = model(target_hidden=target.hidden, input_ids=batch.input_ids, anchors=blocks.anchors,
                    block_keep=blocks.block_keep, vocab_ids=vocab_ids)
        bs, seq = batch.input_ids.shape
        sequence_start = torch.arange(bs, device=blocks.positions.device).view(bs, 1, 1) * seq
        rows, slot_rows = target.distinct_logits(blocks.positions.clamp(max=seq - 1) + sequence_start)
        weight_total = reduce(position_weights(blocks.eval_mask, self.weights.decay).sum())
        return block_loss(
            out.draft_logits,
            blocks.labels,
            blocks.eval_mask,
            self.weights,
            target_logits=rows,
            confidence_logits=out.confidence_logits,
            weight_total=weight_total,
            vocab_ids=vocab_ids,
            target_rows=slot_rows,
        )


@dataclass(frozen=True)
class Eagle3Task:
    """Eagle3: a `ttt_steps`-step test-time-training unroll at every position; with `vocab_ids`, its logits and
    soft CE cover only that draft vocabulary."""

    target_layer_ids: tuple[int, ...]
    ttt_steps: int
    vocab_ids: torch.Tensor | None = None  # [V'] sorted token ids

    def loss(self, model, batch, target, generator, reduce) -> LossTerms:
        scored = eagle3_valid_mask(batch.loss_mask, self.ttt_steps)
        vocab_ids = None if self.vocab_ids is None else self.vocab_ids.to(batch.input_ids.device)
        step_logits = model(
            target_hidden=target.hidden,
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            ttt_steps=self.ttt_steps,
            scored=scored,
            vocab_ids=vocab_ids,
        )
        reads = eagle3_target_positions(scored)
        rows, read_rows = target.distinct_logits(torch.cat(reads))
        weight_total = reduce(scored[0].sum().float())
        return eagle3_loss(step_logits, rows, batch.loss_mask, weight_total=weight_total,
                           target_rows=read_rows.split([len(r) for r in reads]), vocab_ids=vocab_ids)
