"""The attention geometry of a ragged target-verify batch: what a paged-KV attention kernel (FlashInfer's
BatchPrefillWithPagedKVCacheWrapper) is planned with when request r verifies its own window of
v_r = 1 + l_r tokens (the anchor and l_r drafts) after p_r committed tokens.

    qo_indptr[r+1] = sum_{i<=r} v_i             the packed query rows of each request
    kv_len[r]      = p_r + v_r                  its committed prefix plus its own window
    kv_indptr[r+1] = sum_{i<=r} kv_len[i]
    kv_indices     = the token slots of request r's positions 0..kv_len[r]-1, concatenated (page size 1;
                     SGLang's KV index translator fills them from kv_indptr)
    last_page_len  = 1 everywhere

The kernel runs causal with the mask aligned bottom-right (query i of request r sees key j <= i + kv_len - v_r:
the prefix and its window's earlier tokens), so no custom mask is needed.

CUDA-graph replay runs a graph captured for `num_slots` request rows and `num_tokens` packed tokens (a token
tier). A live batch of bs < num_slots requests (sum v <= num_tokens) is padded as SGLang 0.5.23 pads its
ragged layout for replay (`RaggedVerifyLayout.padded_to_bucket`, full coverage): the leftover tokens are
spread over the padding rows (base + 1 for the first `rem` of them). With bs = num_slots nothing is padded,
as SGLang does (`generate_attn_arg_prefill`): the query rows past sum v are padding lanes no row reads.
Padding rows and lanes attend to whatever their slots hold and their outputs are discarded; real rows see
only their own keys, so their outputs do not depend on the padding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RaggedVerifyGeometry:
    verify_lens: torch.Tensor  # [num_slots] int32, padding rows included
    qo_indptr: torch.Tensor  # [num_slots + 1] int32
    kv_lens: torch.Tensor  # [num_slots] int32
    kv_indptr: torch.Tensor  # [num_slots + 1] int32


def pad_verify_lens(*, verify_lens: torch.Tensor, num_slots: int, num_tokens: int) -> torch.Tensor:
    """verify_lens [bs] (each >= 1) -> [num_slots] int32; with padding rows it sums to num_tokens."""
    bs = verify_lens.shape[0]
    if not 1 <= bs <= num_slots:
        raise ValueError(f"a ragged verify batch of {bs} requests does not fit {num_slots} captured slots")
    lens = verify_lens.to(torch.int32)
    if num_slots == bs:
        return lens
    leftover = num_tokens - lens.sum()
    pad_rows = num_slots - bs
    row = torch.arange(pad_rows, device=lens.device, dtype=torch.int32)
    padding = torch.div(leftover, pad_rows, rounding_mode="floor") + (row < leftover % pad_rows).to(torch.int32)
    return torch.cat([lens, padding.to(torch.int32)])


def ragged_verify_geometry(*, prefix_lens: torch.Tensor, verify_lens: torch.Tensor, num_slots: int,
                           num_tokens: int) -> RaggedVerifyGeometry:
    """prefix_lens [num_slots] (committed tokens; the padding rows' fill value after the real ones);
    verify_lens [bs] -> the geometry of the module docstring."""
    if prefix_lens.shape[0] != num_slots:
        raise ValueError(f"prefix_lens has {prefix_lens.shape[0]} rows, the batch {num_slots} slots")
    lens = pad_verify_lens(verify_lens=verify_lens, num_slots=num_slots, num_tokens=num_tokens)
    kv_lens = prefix_lens.to(torch.int32) + lens
    return RaggedVerifyGeometry(lens, exclusive_cumsum(lens), kv_lens, exclusive_cumsum(kv_lens))


def exclusive_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """[n] -> [n + 1] int32: 0, l_0, l_0 + l_1, ..."""
    return torch.nn.functional.pad(lengths.to(torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
