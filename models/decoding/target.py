"""The target model's side of a decoding batch: ragged prefill and verify forwards over one shared KV cache.

Requests in a batch advance at different speeds (each accepts its own number of drafts per round), so their
caches cannot simply be cropped to one length. The cache is one transformers `DynamicCache` whose slots
(columns) are shared by all rows, plus `valid [bs, slots]`: which slots hold a committed token of that row.
A forward appends n new slots to every row; afterwards `commit` keeps, per row, those the row committed
(verification: the anchor and the accepted drafts) and marks the rest as holes. Attention uses an explicit 4-D
mask: a query sees its row's valid slots and the causally earlier new slots; a padding query sees only itself,
so no row of the mask is empty. Position ids count each row's valid slots, so holes shift nothing.

Holes cost memory and attention work, not correctness. Trailing slots that are holes in every row are cropped
after each commit (so batch 1 never keeps a hole), and the cache is compacted (each row's valid slots gathered,
right-aligned) when holes exceed half of it. `select` drops rows; `merge` adds rows prefilled in another runner
(continuous batching), padding the shorter cache with hole slots.

Target features (the tapped layer outputs the drafter conditions on) are captured during the same forwards, by a
LayerTap whose hooks the caller keeps installed while it decodes: installing and removing them around each forward
cost 2-3% of a decode round of the embedded target (80 us of 3.2-3.7 ms, alternated forwards).
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from dspark.models.target_features import LayerTap

COMPACT_HOLE_FRACTION = 0.5


@dataclass(frozen=True)
class TargetStep:
    logits: torch.Tensor  # [bs, n, vocab] next-token logits after each new slot ([bs, 1, vocab]: the last only)
    features: Optional[torch.Tensor]  # [bs, n, n_taps*hidden] tapped layer outputs; None without taps


class TargetRunner:
    """One batch's target forwards (prefill, then one verify forward per round) over a ragged KV cache."""

    def __init__(self, model: torch.nn.Module, batch_size: int, tap: Optional[LayerTap] = None):
        """tap: an active LayerTap on `model`, whose features each forward returns; None: no features."""
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.tap = tap
        self.cache = DynamicCache()
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device)  # [bs, slots]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # committed tokens per row

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, new_valid: torch.Tensor, last_logits_only: bool = False) -> TargetStep:
        """Run tokens [bs, n] long as n new slots; new_valid [bs, n] bool marks the real ones (others: padding).
        last_logits_only: logits [bs, 1, vocab] for the last slot alone (a prefill needs no more; the vocabulary
        projection of every prompt position would cost more than the rest of a short prompt's forward)."""
        positions = (self.lengths.unsqueeze(1) + new_valid.long().cumsum(dim=1) - 1).clamp(min=0)
        mask = self.attention_mask(new_valid)
        kwargs = dict(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                      use_cache=True, logits_to_keep=1 if last_logits_only else 0)
        logits = self.model(**kwargs).logits
        return TargetStep(logits=logits, features=self.tap.pop() if self.tap is not None else None)

    def attention_mask(self, new_valid: torch.Tensor) -> torch.Tensor:
        """Additive mask [bs, 1, n, slots + n]: 0 where a query may look, the dtype's minimum elsewhere."""
        bs, n = new_valid.shape
        own = torch.eye(n, dtype=torch.bool, device=self.device)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        sees_new = (causal & new_valid.unsqueeze(1)) | own  # [bs, n, n]
        sees_past = self.valid.unsqueeze(1).expand(bs, n, -1) & new_valid.unsqueeze(2)
        visible = torch.cat([sees_past, sees_new], dim=2)
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill(~visible, torch.finfo(self.dtype).min).unsqueeze(1)

    def commit(self, kept: torch.Tensor) -> None:
        """After a forward of n slots: keep each row's kept [bs, n] bool slots, make the others holes."""
        self.valid = torch.cat([self.valid, kept], dim=1)
        self.lengths = self.lengths + kept.sum(dim=1)
        trailing = int((~self.valid.any(dim=0)).flip(0).long().cumprod(0).sum())
        if trailing:
            self.cache.crop(-trailing)
            self.valid = self.valid[:, : self.valid.shape[1] - trailing]
        if self.valid.numel() and (~self.valid).float().mean() > COMPACT_HOLE_FRACTION:
            self.compact()

    def compact(self) -> None:
        """Gather each row's valid slots, right-aligned, into a cache as long as the longest row."""
        width = int(self.lengths.max())
        # Stable sort puts holes first and keeps the valid slots in order; the last `width` columns remain.
        order = torch.sort(self.valid.long(), dim=1, stable=True).indices[:, -width:]
        self.valid = self.valid.gather(1, order)
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)

    def merge(self, other: "TargetRunner") -> None:
        """Append other's rows (requests prefilled separately) to this batch; the shorter cache gets hole
        slots on the left so both have the same slots."""
        width = max(self.valid.shape[1], other.valid.shape[1])
        for runner in (self, other):
            extra = width - runner.valid.shape[1]
            if extra:
                runner.valid = torch.cat([runner.valid.new_zeros(runner.valid.shape[0], extra), runner.valid], dim=1)
                for layer in runner.cache.layers:
                    layer.keys, layer.values = (F.pad(t, (0, 0, extra, 0)) for t in (layer.keys, layer.values))
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys, mine.values = torch.cat([mine.keys, theirs.keys]), torch.cat([mine.values, theirs.values])
        self.valid, self.lengths = torch.cat([self.valid, other.valid]), torch.cat([self.lengths, other.lengths])

    def select(self, index: torch.Tensor) -> None:
        """Keep (and reorder to) the rows in index [new_bs] long."""
        self.cache.batch_select_indices(index)
        self.valid, self.lengths = self.valid[index], self.lengths[index]
