"""Building blocks shared by the drafters: RMSNorm, RoPE, SwiGLU MLP, masked attention, a ragged KV cache.

The numerics follow the Qwen3 target in transformers (RMSNorm normalizes in float32 and casts back before
the scale; RoPE is the rotate-half form with cos/sin in float32), so a drafter sees the same arithmetic in
training, in our decoding engine and in SGLang.

`RaggedKVCache` holds per-layer keys/values for a batch whose requests have different lengths: one padded
tensor per layer [bs, kv_heads, capacity, head_dim] plus `lengths [bs]`. Entry j of request b is valid iff
j < lengths[b]; writes land at lengths[b] + i for i < new_lengths[b]; `crop` forgets a suffix (used to drop
scratch entries after verification); `select` and `merge` drop and add requests. Capacity doubles on demand. Padded slots hold finite values, so a
masked softmax over them never produces NaN.
"""
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for arbitrary per-request positions (rotate-half / NeoX layout)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # positions: [bs, n] long -> cos, sin: [bs, n, head_dim] float32
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [bs, heads, n, head_dim]; cos, sin: [bs, n, head_dim]
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    # x: [bs, n, heads * head_dim] -> [bs, heads, n, head_dim]
    bs, n, _ = x.shape
    return x.view(bs, n, heads, -1).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention with an explicit boolean mask; every query must see at least one key.

    q: [bs, heads, nq, head_dim]; k, v: [bs, kv_heads, nk, head_dim]; visible: [bs, nq, nk] bool.
    Returns [bs, nq, heads * head_dim]. Scale is head_dim ** -0.5.
    """
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible.unsqueeze(1),
                                         enable_gqa=q.shape[1] != k.shape[1])
    bs, heads, nq, head_dim = out.shape
    return out.transpose(1, 2).reshape(bs, nq, heads * head_dim)


def init_weights(module: nn.Module, std: float) -> None:
    """HF-style init: Linear/Embedding ~ N(0, std), biases 0; norms keep their ones."""
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            nn.init.normal_(sub.weight, mean=0.0, std=std)
        if isinstance(sub, nn.Linear) and sub.bias is not None:
            nn.init.zeros_(sub.bias)


class RaggedKVCache:
    """Per-layer K/V for requests of different lengths (see module docstring)."""

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype, capacity: int = 16):
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        self.keys: List[torch.Tensor] = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values: List[torch.Tensor] = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, new_lengths: torch.Tensor) -> None:
        """Store new entries after the current lengths; call `advance` once all layers are written.

        k, v: [bs, kv_heads, n, head_dim]; new_lengths: [bs] long, entries i >= new_lengths[b] are padding.
        """
        self._reserve(int((self.lengths + new_lengths).max()) if new_lengths.numel() else 0)
        rows, cols = (torch.arange(k.shape[2], device=k.device) < new_lengths.unsqueeze(1)).nonzero(as_tuple=True)
        slots = self.lengths[rows] + cols
        self.keys[layer][rows, :, slots] = k[rows, :, cols].to(self.keys[layer].dtype)
        self.values[layer][rows, :, slots] = v[rows, :, cols].to(self.values[layer].dtype)

    def advance(self, new_lengths: torch.Tensor) -> None:
        self.lengths = self.lengths + new_lengths

    def crop(self, lengths: torch.Tensor) -> None:
        """Forget entries at and after lengths[b] (a no-op where lengths[b] >= the current length)."""
        self.lengths = torch.minimum(self.lengths, lengths)

    def valid(self) -> torch.Tensor:
        # -> [bs, capacity] bool: which slots hold entries
        return torch.arange(self.capacity, device=self.lengths.device) < self.lengths.unsqueeze(1)

    def select(self, index: torch.Tensor) -> None:
        """Keep (and reorder to) the requests in index [new_bs] long."""
        self.keys = [k[index] for k in self.keys]
        self.values = [v[index] for v in self.values]
        self.lengths = self.lengths[index]

    def merge(self, other: "RaggedKVCache") -> None:
        """Append other's requests as new rows (continuous batching: requests joining a running batch)."""
        self._reserve(other.capacity)
        other._reserve(self.capacity)
        self.keys = [torch.cat([a, b]) for a, b in zip(self.keys, other.keys)]
        self.values = [torch.cat([a, b]) for a, b in zip(self.values, other.values)]
        self.lengths = torch.cat([self.lengths, other.lengths])

    def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        grow = max(needed, 2 * self.capacity) - self.capacity
        self.keys = [F.pad(k, (0, 0, 0, grow)) for k in self.keys]
        self.values = [F.pad(v, (0, 0, 0, grow)) for v in self.values]
