"""Where a training micro-batch gets the frozen target's outputs: a target forward per step, or a cache on disk.

The target does not change during drafter training, so its outputs on a fixed dataset are the same at every
epoch. `OnlineFeatures` runs the target on each micro-batch (the reference's online mode); `CachedFeatures`
runs it once per sample (`compute_features`), keeps what the losses need and serves every later epoch from
memory, so a step costs only the drafter's forward and backward:

- hidden [n, seq, n_taps*hidden]: the tapped layer outputs (TargetOutputs.hidden);
- last_hidden [n, seq, hidden]: the post-final-norm hidden; the logits are lm_head(last_hidden), recomputed per
  micro-batch at the positions the loss reads (TargetOutputs.logits), because the full-vocabulary logits would
  need vocab/hidden = 85x the space (SmolLM2).

Both are stored in `dtype` (bfloat16 by default: 4.6 KB a token for SmolLM2 with 3 taps, against 100 KB for
fp32 logits). Positions past a sample's attention mask (right padding) hold zeros: no anchor or context of a
block drafter reaches them and the Eagle3 loss masks them out, so they are never read as data.

A cache is one .pt file named by the hash of its key (the dataset's key, the tapped layers, the storage dtype
and whether the target ran under bf16 autocast) beside that key as JSON, like the token data cache (data.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

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


@dataclass(frozen=True)
class CachedFeatures:
    """The target's outputs on every sample of a dataset, computed once (module docstring)."""

    hidden: torch.Tensor  # [n, seq, n_taps*hidden] in the storage dtype
    last_hidden: torch.Tensor  # [n, seq, hidden] in the storage dtype
    lm_head: torch.nn.Module  # the target's frozen output embedding

    def __call__(self, index: torch.Tensor, batch: TokenDataset) -> TargetOutputs:
        # index: [bs] long, rows of the dataset the batch holds
        device = batch.input_ids.device
        return TargetOutputs(hidden=self.hidden[index].to(device=device, dtype=torch.float32),
                             last_hidden=self.last_hidden[index].to(device=device, dtype=torch.float32),
                             lm_head=self.lm_head)


@torch.no_grad()
def compute_features(
    target: torch.nn.Module,
    dataset: TokenDataset,
    layer_ids: tuple[int, ...],
    dtype: torch.dtype = torch.bfloat16,
    batch_size: int = 16,
    progress: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [n, seq, n_taps*hidden], last_hidden [n, seq, hidden]) in `dtype`, zero past each attention mask.

    Runs under the caller's autocast. Each batch is cut to its longest sample (right padding only), so the
    forward skips the padding columns no sample of the batch needs.
    """
    n, seq = dataset.input_ids.shape
    device = next(target.parameters()).device
    hidden = last_hidden = None
    for start in tqdm(range(0, n, batch_size), desc="caching target features", unit="batch", disable=not progress):
        rows = torch.arange(start, min(start + batch_size, n))
        width = int(dataset.attention_mask[rows].sum(dim=1).max())
        ids, mask = dataset.input_ids[rows, :width].to(device), dataset.attention_mask[rows, :width].to(device)
        features = capture_target_features(target, ids, layer_ids, attention_mask=mask.long())
        if hidden is None:
            hidden = torch.zeros(n, seq, features.hidden.shape[-1], dtype=dtype)
            last_hidden = torch.zeros(n, seq, features.last_hidden.shape[-1], dtype=dtype)
        keep = mask.unsqueeze(-1).cpu()
        hidden[rows, :width] = torch.where(keep, features.hidden.cpu(), 0).to(dtype)
        last_hidden[rows, :width] = torch.where(keep, features.last_hidden.cpu(), 0).to(dtype)
    return hidden, last_hidden


def feature_cache_path(cache_dir: Path, key: dict) -> Path:
    """The .pt file of the features for `key` (its JSON key sits beside it)."""
    return cache_dir / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16] + ".pt")


def save_features(hidden: torch.Tensor, last_hidden: torch.Tensor, key: dict, path: Path) -> None:
    """Write the features (compute_features' pair) to `path` and their key to `path`.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"hidden": hidden, "last_hidden": last_hidden}, path)
    path.with_suffix(".json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")


def load_features(path: Path, key: dict, lm_head: torch.nn.Module) -> CachedFeatures | None:
    """The cached features at `path` if they were saved with exactly this `key`, else None."""
    meta = path.with_suffix(".json")
    if not path.exists() or not meta.exists() or json.loads(meta.read_text()) != json.loads(json.dumps(key)):
        return None
    stored = torch.load(path)
    return CachedFeatures(stored["hidden"], stored["last_hidden"], lm_head)
