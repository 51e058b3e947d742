"""A frozen float32 projection on CPU through oneDNN: the vocabulary heads of the target and the drafter.

PyTorch runs a float32 CPU linear through MKL's sgemm. For the vocabulary projection of a few rows, which is
what a decode step (1 row), a verify round (1 + k rows) and a drafter block (gamma rows) ask for, that path can
be several times slower than reading the weight once would allow. On the 2-core AVX2 AMD EPYC of 2026-12-02,
SmolLM2's lm_head (49152 x 576, 113 MB) took 12 ms for 1 row and 37-49 ms for 7 rows through MKL; oneDNN's
linear with the weight packed once took 7 ms and 12-15 ms; from about 128 rows on MKL was as fast or faster (256
rows: 7% slower through oneDNN). On other CPUs MKL may win everywhere, so the caller measures both up to the
largest row count it will send (`onednn_wins_up_to`) and keeps MKL beyond the last count oneDNN won.

    reference  F.linear(x, weight, bias)
    kernel     onednn_linear(x, pack(weight), bias): x converted to oneDNN's layout, the product, back to dense

Both compute the same float32 products; the sums differ in rounding order only (tested against each other).
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch has oneDNN's CPU linear."""
    return torch.backends.mkldnn.is_available() and hasattr(torch._C._nn, "mkldnn_linear")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The [out, in] float32 CPU weight in oneDNN's layout (a copy: pack again after changing the weight)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"oneDNN linear takes a float32 CPU weight, got {weight.dtype} on {weight.device}")
    return weight.detach().contiguous().to_mkldnn()


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., in] with `packed` = pack(weight); returns [..., out] dense."""
    rows = x.reshape(-1, x.shape[-1]).contiguous().to_mkldnn()
    out = torch._C._nn.mkldnn_linear(rows, packed, bias).to_dense()
    return out.reshape(*x.shape[:-1], out.shape[-1])


def onednn_wins_up_to(weight: torch.Tensor, row_counts: Sequence[int], repeats: int = 5) -> int:
    """The largest of row_counts (ascending) up to which onednn_linear beats F.linear on `weight` at every one
    of them, by median time here; 0 when it loses at the first (or this torch has no oneDNN)."""
    if not available():
        return 0
    packed = pack(weight)
    generator = torch.Generator().manual_seed(0)  # leaves the global RNG as the caller seeded it

    def median_seconds(project, rows: int) -> float:
        x = torch.randn(rows, weight.shape[1], generator=generator)
        project(x)  # warm-up: first calls allocate and pick kernels
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            project(x)
            times.append(time.perf_counter() - began)
        return sorted(times)[len(times) // 2]

    wins_up_to = 0
    with torch.no_grad():
        for rows in sorted(row_counts):
            if median_seconds(lambda x: onednn_linear(x, packed), rows) >= median_seconds(
                    lambda x: F.linear(x, weight), rows):
                break
            wins_up_to = rows
    return wins_up_to
