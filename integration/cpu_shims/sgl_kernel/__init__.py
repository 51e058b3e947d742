"""CPU stand-in for `sgl_kernel`, SGLang's CUDA kernel package (PyPI `sglang-kernel`).

SGLang 0.5.23 imports `sgl_kernel` at module import time even on CPU (`SGLANG_USE_CPU_ENGINE=1`), but
PyPI ships only CUDA builds of it and the CPU build needs source and AMX hardware we do not have.
On a CPU without AMX every layer SGLang runs for plain serving takes its `forward_native` path, so no
op of this package is called; the names only have to resolve at import. The ops SGLang's DSPARK
speculative decoding calls on CPU (KV slot-row copies and req_to_token bookkeeping) are implemented
below in PyTorch, with the semantics of SGLang's Triton kernels of the same names.

This shim is put on `sys.path` *after* site-packages by the environment set-up (a `.pth` file), so a
real `sgl_kernel` installed on a GPU machine always wins. Every op it is asked to *run* that it has no
working implementation for raises `NotImplementedError` naming the op, never a silent wrong result.
"""
from __future__ import annotations

import ctypes

import torch


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """Copy slot rows src_loc -> tgt_loc in every KV buffer of a pool.

    data_ptrs[i] is the host address of buffer i and strides[i] its row size in bytes (a slot's K or V
    for one layer), as SGLang's tiled Triton copy takes them.
    """
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        buffer = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        buffer[tgt] = buffer[src]


def _ragged_slots(req_pool_indices: torch.Tensor, start: torch.Tensor, end: torch.Tensor):
    """(rows, cols) of req_to_token for every position start[b] <= j < end[b] of every request, request-major:
    the packed order in which SGLang's kernels read or write `out_cache_loc`."""
    lengths = (end.long() - start.long()).clamp(min=0)
    rows = req_pool_indices.long().repeat_interleave(lengths)
    first = torch.cumsum(lengths, 0) - lengths
    offsets = torch.arange(int(lengths.sum()), device=lengths.device) - first.repeat_interleave(lengths)
    return rows, start.long().repeat_interleave(lengths) + offsets


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len) -> None:
    """req_to_token[req b, start[b]:end[b]] = the next end[b] - start[b] entries of out_cache_loc."""
    rows, cols = _ragged_slots(req_pool_indices, start_offset, end_offset)
    req_to_token[rows, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len) -> None:
    """The inverse gather: out_cache_loc, packed request-major, = req_to_token[req b, start[b]:end[b]]."""
    rows, cols = _ragged_slots(req_pool_indices, start_offset, end_offset)
    out_cache_loc[: rows.numel()] = req_to_token[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                           topk, num_steps) -> None:
    """out_cache_loc[b * topk * num_steps + i] = req_to_token[req b, seq_lens[b] + i], i < topk * num_steps."""
    assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, seq_lens, seq_lens + topk * num_steps,
                                 out_cache_loc, pool_len)


def _missing_op(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this process runs dspark's CPU stand-in for SGLang's "
            f"CUDA kernel package, which has no CPU implementation of '{name}'. Run on a GPU machine "
            f"with sglang-kernel installed, or choose an SGLang code path that does not need this op."
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str):
    # Dunder lookups (e.g. __path__, __version__) must fail normally so importlib and
    # version probes see a plain module, not a callable.
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing_op(name)
