"""Where a training micro-batch gets the frozen target's outputs: a target forward per step, or a store on disk.

The target does not change during drafter training, so its outputs on a fixed dataset are the same at every
epoch. `OnlineFeatures` runs the target on each micro-batch (the reference's online mode, always available);
`feature_rows` runs it once over a range of samples for the feature store (feature_store.py), which keeps what
the losses need and serves every later epoch from memory-mapped shards, so a step costs only the drafter's forward
and backward:

- hidden [seq, n_taps*hidden] a sample: the tapped layer outputs (TargetOutputs.hidden);
- last_hidden [seq, hidden] a sample: the post-final-norm hidden; the logits are lm_head(last_hidden), recomputed
  per micro-batch at the positions the loss reads, each once (TargetOutputs.distinct_logits), because the
  full-vocabulary logits would need vocab/hidden = 85x the space (SmolLM2).

Positions past a sample's attention mask (right padding) hold zeros: no anchor or context of a block drafter
reaches them and the Eagle3 loss masks them out, so they are never read as data.
"""
from __future__ import annotations

from typing import Iterator

import torch

from dspark.models.target_features import capture_target_features
from dspark.models.training.data import TokenDataset
from dspark.models.training.tasks import TargetOutputs, target_outputs


class OnlineFeatures:
    """The frozen target run on every micro-batch."""

    def __init__(self, target: torch.nn.Module, layer_ids: tuple[int, ...]) -> None:
        self.target, self.layer_ids = target, layer_ids

    def __call__(self, index: torch.Tensor, batch: TokenDataset) -> TargetOutputs:
        # index: [bs] long, the batch's sample ids (unused: the batch itself is run)
        return target_outputs(self.target, batch, self.layer_ids)


@torch.no_grad()
def feature_rows(
    target: torch.nn.Module,
    dataset: TokenDataset,
    rows: range,
    layer_ids: tuple[int, ...],
    batch_size: int = 16,
) -> Iterator[tuple[range, torch.Tensor, torch.Tensor]]:
    """(rows of a batch, hidden [b, seq, n_taps*hidden], last_hidden [b, seq, hidden]) in float32 on the CPU for
    each batch of `rows`, zero past each attention mask.

    Runs under the caller's autocast. Each batch is cut to its longest sample (right padding only), so the
    forward skips the padding columns no sample of the batch needs.
    """
    seq = dataset.input_ids.shape[1]
    device = next(target.parameters()).device
    for start in range(rows.start, rows.stop, batch_size):
        batch = range(start, min(start + batch_size, rows.stop))
        index = torch.tensor(batch, dtype=torch.long)
        width = int(dataset.attention_mask[index].sum(dim=1).max())
        ids, mask = dataset.input_ids[index, :width].to(device), dataset.attention_mask[index, :width].to(device)
        features = capture_target_features(target, ids, layer_ids, attention_mask=mask.long())
        keep = mask.unsqueeze(-1).cpu()
        padded = []
        for values in (features.hidden, features.last_hidden):
            full = torch.zeros(len(batch), seq, values.shape[-1])
            full[:, :width] = torch.where(keep, values.float().cpu(), 0)
            padded.append(full)
        yield batch, padded[0], padded[1]
