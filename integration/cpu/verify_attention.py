"""TARGET_VERIFY attention for SGLang's torch-native backend: the forward mode DSpark runs on CPU.

SGLang's DSPARK worker runs two forwards in `ForwardMode.TARGET_VERIFY`: the drafter's block pass
(anchor + γ mask tokens, attention *non-causal* inside the block: the draft layers are
`AttentionType.ENCODER_ONLY`) and the target's verify pass over each request's window (causal).
In that mode `forward_batch.seq_lens` holds each request's committed prefix only and
`extend_prefix_lens` is unset, which SGLang's torch-native backend cannot handle; its CUDA backends
(FA3, FlashInfer) take the window from `spec_info`. This module is the same attention in PyTorch:

    request r, window of n_r query tokens at positions prefix_r .. prefix_r + n_r - 1
    keys   = KV[req_to_token[r, :prefix_r]]  ++  the window's own K/V (just computed)
    mask   = every prefix key; window key w visible to query i iff w <= i (target) or always (draft)

Window lengths come from `spec_info.ragged_verify_layout` (per-request `verify_lens`, packed at
`extend_start_loc`; the packed total may be padded up to a graph bucket) or, for uniform windows,
`spec_info.draft_token_num`. The batch is padded to [R, max window] and [R, max keys] and run as one
SDPA call with a boolean mask, so the cost is one attention, not a Python loop per request.
"""
from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention


def window_layout(forward_batch, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, length) of each request's query window inside the packed [num_tokens] batch."""
    spec_info = forward_batch.spec_info
    batch_size = forward_batch.seq_lens.shape[0]
    layout = getattr(spec_info, "ragged_verify_layout", None)
    if layout is not None:
        return layout.extend_start_loc.long(), layout.verify_lens.long()
    width = getattr(spec_info, "draft_token_num", None) or num_tokens // batch_size
    if width * batch_size > num_tokens:
        raise ValueError(f"TARGET_VERIFY batch of {num_tokens} tokens cannot hold {batch_size} windows "
                         f"of {width} tokens")
    starts = torch.arange(batch_size, device=forward_batch.seq_lens.device) * width
    return starts, torch.full_like(starts, width)


def padded_rows(packed: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int):
    """[R, width, ...] rows gathered from `packed` [N, ...] at starts[r] + 0..lengths[r]-1 (zero padded)."""
    offsets = torch.arange(width, device=packed.device)
    valid = offsets[None, :] < lengths[:, None]
    index = (starts[:, None] + offsets[None, :]).clamp(max=packed.shape[0] - 1)
    rows = packed[index]
    return rows * valid.view(*valid.shape, *([1] * (rows.dim() - 2))).to(rows.dtype), valid


def verify_attention(q, k, v, *, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                     starts, lengths, causal: bool, scaling: float) -> torch.Tensor:
    """Attention output [N, H, D] for packed queries q [N, H, D]; k/v [N, Hkv, D] are the window's own."""
    batch_size = prefix_lens.shape[0]
    window = int(lengths.max())
    max_prefix = int(prefix_lens.max())
    q_rows, q_valid = padded_rows(q, starts, lengths, window)                  # [R, W, H, D]
    k_window, _ = padded_rows(k, starts, lengths, window)                      # [R, W, Hkv, D]
    v_window, _ = padded_rows(v, starts, lengths, window)
    prefix_positions = torch.arange(max_prefix, device=q.device)
    prefix_valid = prefix_positions[None, :] < prefix_lens[:, None]            # [R, P]
    prefix_slots = req_to_token[req_pool_indices][:, :max_prefix].long() * prefix_valid
    keys = torch.cat([k_cache[prefix_slots].to(q.dtype), k_window], dim=1)    # [R, P + W, Hkv, D]
    values = torch.cat([v_cache[prefix_slots].to(q.dtype), v_window], dim=1)

    query_pos = torch.arange(window, device=q.device)
    window_visible = query_pos[None, None, :] < lengths[:, None, None]          # key w exists
    if causal:
        window_visible = window_visible & (query_pos[None, None, :] <= query_pos[None, :, None])
    else:
        window_visible = window_visible.expand(batch_size, window, window)
    mask = torch.cat([prefix_valid[:, None, :].expand(batch_size, window, max_prefix), window_visible], dim=2)

    out = scaled_dot_product_attention(q_rows.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                       attn_mask=mask[:, None], scale=scaling,
                                       enable_gqa=q.shape[1] != k.shape[1]).transpose(1, 2)  # [R, W, H, D]
    packed = out.new_zeros(q.shape[0], q.shape[1], out.shape[-1])
    token_index = (starts[:, None] + query_pos[None, :])[q_valid]
    packed[token_index] = out[q_valid]
    return packed


def forward_target_verify(backend, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
    """`TorchNativeAttnBackend.forward_extend` for `ForwardMode.TARGET_VERIFY` (same contract)."""
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if layer.is_cross_attention or (layer.sliding_window_size is not None and layer.sliding_window_size > -1):
        raise NotImplementedError(
            f"dspark CPU TARGET_VERIFY attention does not implement cross attention or sliding windows "
            f"(layer {layer.layer_id})")
    q_heads = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    if k is None or v is None:  # K/V were written by a fused path: read the window back from the pool
        loc = forward_batch.out_cache_loc
        k_heads = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)[loc]
        v_heads = backend.token_to_kv_pool.get_value_buffer(layer.layer_id)[loc]
    else:
        k_heads = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)
        v_heads = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)
        if save_kv_cache:
            backend.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc), k, v)
    starts, lengths = window_layout(forward_batch, q_heads.shape[0])
    out = verify_attention(
        q_heads, k_heads.to(q.dtype), v_heads.to(q.dtype),
        k_cache=backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        v_cache=backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        req_to_token=backend.req_to_token_pool.req_to_token, req_pool_indices=forward_batch.req_pool_indices,
        prefix_lens=forward_batch.seq_lens.long(), starts=starts, lengths=lengths,
        causal=layer.attn_type != AttentionType.ENCODER_ONLY, scaling=layer.scaling)
    return out.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)
