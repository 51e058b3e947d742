"""Float32 CPU products of a few rows against a frozen weight: three ways to compute F.linear, and a probe.

Decoding multiplies the same weights by very few rows: a decode step 1 row per request, a verify round 1 + k, a
drafter block gamma. PyTorch computes F.linear(x, W) as x @ W^T through MKL, whose kernels for these shapes can
run far below what reading the weight once allows. On the 2-core AVX2 AMD EPYC of 2026-12-03, SmolLM2-135M's
MLP weight (1536 x 576), streamed from memory across its 30 layers: 240 us at 1 row, 385 / 403 / 359 us at
2 / 4 / 7 rows through F.linear; 146 / 158 / 300 us at 2 / 4 / 7 rows as W @ x^T (1 row sent as 2). The
vocabulary head (49152 x 576) was fastest through oneDNN at 1 and 6-8 rows. Which way wins depends on the CPU,
the shape and the row count, so the caller measures (`fastest_strategies`) and keeps F.linear where it wins.

    default        F.linear(x, W, b)                         reference; MKL's x @ W^T
    weight-major   (W @ x^T)^T + b, made contiguous           MKL with the weight as the left operand; a single
                                                              row is sent twice (its 1-column path is slow here)
    onednn         oneDNN's linear on pack(W)                 the weight packed once into oneDNN's layout

All three compute the same float32 products; the sums differ in rounding order only (tested against each other).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

STRATEGIES = ("default", "weight-major", "onednn")  # in order of preference on a tie


def onednn_available() -> bool:
    """Whether this torch has oneDNN's CPU linear."""
    return torch.backends.mkldnn.is_available() and hasattr(torch._C._nn, "mkldnn_linear")


def available_strategies() -> tuple:
    return STRATEGIES if onednn_available() else STRATEGIES[:2]


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


def weight_major_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., in] computed as (weight @ x^T)^T; returns [..., out] contiguous."""
    rows = x.reshape(-1, x.shape[-1])
    single = rows.shape[0] == 1
    if single:
        rows = torch.cat([rows, rows])  # a copy, not expand(): a stride-0 operand takes an even slower path
    out = torch.mm(weight, rows.t()) if bias is None else torch.addmm(bias.unsqueeze(1), weight, rows.t())
    out = out.t()[:1] if single else out.t()
    return out.contiguous().reshape(*x.shape[:-1], weight.shape[0])


def apply_strategy(strategy: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   packed: Optional[torch.Tensor]) -> torch.Tensor:
    """F.linear(x, weight, bias) the way `strategy` names (`packed` = pack(weight), needed by onednn only)."""
    if strategy == "weight-major":
        return weight_major_linear(x, weight, bias)
    if strategy == "onednn":
        return onednn_linear(x, packed, bias)
    return F.linear(x, weight, bias)


# Weights timed per probe: enough bytes that they stream from memory, as in a forward over all layers, rather
# than sit in the last-level cache (which would flatter every strategy at a few rows).
PROBE_BYTES = 64 << 20


def fastest_strategies(weights: Sequence[torch.Tensor], row_counts: Sequence[int],
                       repeats: int = 3) -> Dict[int, str]:
    """{rows: the fastest of available_strategies()} for same-shape float32 CPU weights, by the median time of
    one pass over (enough of) the weights at each row count; a tie keeps the earlier strategy in STRATEGIES."""
    chosen, total = [], 0
    for weight in weights:
        chosen.append(weight.detach())
        total += weight.numel() * weight.element_size()
        if total >= PROBE_BYTES:
            break
    strategies = available_strategies()
    packed = [pack(w) for w in chosen] if "onednn" in strategies else [None] * len(chosen)
    generator = torch.Generator().manual_seed(0)  # leaves the global RNG as the caller seeded it

    def median_seconds(strategy: str, x: torch.Tensor) -> float:
        one_pass: Callable[[], None] = lambda: [apply_strategy(strategy, x, w, None, p)
                                                for w, p in zip(chosen, packed)]
        one_pass()  # warm-up: first calls allocate and pick kernels
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            one_pass()
            times.append(time.perf_counter() - began)
        return sorted(times)[len(times) // 2]

    plan = {}
    with torch.no_grad():
        for rows in sorted(set(row_counts)):
            x = torch.randn(rows, chosen[0].shape[1], generator=generator)
            seconds = {strategy: median_seconds(strategy, x) for strategy in strategies}
            plan[rows] = min(strategies, key=lambda s: (seconds[s], strategies.index(s)))
    return plan
