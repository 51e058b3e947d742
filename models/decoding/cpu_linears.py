"""The float32 CPU linears of the target and the drafter, each computed the way a load-time probe measured fastest.

Decoding runs every weight of both models on a few rows at a time (kernels/cpu_linear.py), where PyTorch's
default product can cost twice what another way of computing the same F.linear does. `with_fastest_linears`
groups a model's float32 CPU nn.Linear modules by shape, times the strategies on each group's own weights at the
row counts decoding sends, and swaps in a `ProbedLinear` for every linear of a group where some row count is
faster another way. Measured on SmolLM2-135M (2-core AVX2 EPYC, 2026-12-03): a target forward of 1 / 4 / 7 rows
over a 200-token cache took 49 / 83 / 95 ms with PyTorch's linears and 48 / 51 / 79 ms probed, identical argmax.

Speculative decoding and the target-alone baseline run through the same probed modules, so both sides of every
speed comparison get the faster products. GPU and non-float32 linears are left alone.
"""
from collections import Counter, defaultdict
from typing import Dict, Sequence

import torch
from torch import nn

from dspark.kernels.cpu_linear import apply_strategy, fastest_strategies, pack


class ProbedLinear(nn.Module):
    """A frozen nn.Linear that computes a call of r rows by the strategy probed for the smallest probed row count
    >= r, and by PyTorch's default beyond the largest. It keeps the linear's own Parameters as `.weight` / `.bias`
    (a tied embedding, a state_dict and anything reading the weight see no change) beside a packed copy for
    oneDNN when its plan uses oneDNN."""

    def __init__(self, linear: nn.Linear, plan: Dict[int, str]):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        largest = max(plan)
        probed = sorted(plan)
        # by_rows[r]: the strategy for r rows, r = 1..largest (index 0 unused)
        self.by_rows = ["default"] + [plan[next(p for p in probed if p >= r)] for r in range(1, largest + 1)]
        self.packed = pack(linear.weight) if "onednn" in plan.values() else None  # not in the state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        strategy = self.by_rows[rows] if rows < len(self.by_rows) else "default"
        return apply_strategy(strategy, x, self.weight, self.bias, self.packed)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {describe(self.by_rows)}"


def describe(by_rows: Sequence[str]) -> str:
    """'1:onednn 2-5:weight-major 6-8:onednn' from by_rows (runs of equal strategies; 'default' included)."""
    runs, start = [], 1
    for rows in range(1, len(by_rows) + 1):
        if rows == len(by_rows) or by_rows[rows] != by_rows[start]:
            span = f"{start}" if rows - 1 == start else f"{start}-{rows - 1}"
            runs.append(f"{span}:{by_rows[start]}")
            start = rows
    return " ".join(runs)


def probed_on_cpu(linear: nn.Module) -> bool:
    return (type(linear) is nn.Linear and linear.weight.device.type == "cpu"
            and linear.weight.dtype == torch.float32)


def with_fastest_linears(model: nn.Module, row_counts: Sequence[int], skip: Sequence[nn.Module] = ()) -> nn.Module:
    """`model` with each float32 CPU nn.Linear swapped for a ProbedLinear where its shape's group measured another
    strategy faster at some of row_counts (module docstring); the linears in `skip` (ones decoding never calls)
    are neither timed nor packed. Returns the model (changed in place)."""
    skipped = {id(linear) for linear in skip}
    groups = defaultdict(list)  # (out, in) -> [(parent, attribute name, linear)]
    for parent in list(model.modules()):
        for name, child in parent._modules.items():  # every name, also a second name of a shared module
            if probed_on_cpu(child) and id(child) not in skipped:
                groups[tuple(child.weight.shape)].append((parent, name, child))
    for members in groups.values():
        distinct = list({id(linear): linear for _, _, linear in members}.values())  # a shared head, once
        plan = fastest_strategies([linear.weight for linear in distinct], row_counts)
        if set(plan.values()) == {"default"}:
            continue
        probed = {id(linear): ProbedLinear(linear, plan) for linear in distinct}
        for parent, name, linear in members:
            setattr(parent, name, probed[id(linear)])
    return model


def linear_plans(model: nn.Module) -> Dict[str, str]:
    """{'576x1536 (30)': '1:default 2-8:weight-major ...'}: how the model's probed linears compute, per shape and
    plan, with how many linears share it (reports record it beside their speeds); {} when none is probed."""
    probed = {id(m): m for m in model.modules() if isinstance(m, ProbedLinear)}.values()
    counts = Counter((f"{m.out_features}x{m.in_features}", describe(m.by_rows)) for m in probed)
    return {f"{shape} ({count})": plan for (shape, plan), count in sorted(counts.items())}
