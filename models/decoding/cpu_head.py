"""The vocabulary head the engine runs on CPU: oneDNN's linear where it measures faster than MKL's.

The lm_head is the largest single product of a decode step, a verify round and a drafting pass (SmolLM2: 49152 x
576 of the target's 135M parameters), and PyTorch's default CPU path for it is slow at the few rows decoding asks
for on some CPUs (kernels/onednn_linear.py). `fastest_head` times both paths on the head itself at the row
counts it will see and swaps in `OneDnnHead` only when oneDNN wins, so a CPU where MKL is faster keeps MKL.
The head is frozen during decoding; the swap never touches a GPU or a non-float32 head.
"""
from typing import Sequence

import torch
from torch import nn

from dspark.kernels.onednn_linear import faster_on_this_cpu, onednn_linear, pack


class OneDnnHead(nn.Module):
    """A frozen nn.Linear computed by oneDNN. It keeps the linear's own Parameter as `.weight` (a tied embedding
    and anything reading the head's weight see no change) beside the packed copy the product uses."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = pack(linear.weight)  # a plain attribute: not saved in a state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, backend=oneDNN"


def fastest_head(head: nn.Module, row_counts: Sequence[int]) -> nn.Module:
    """`head` itself, or an OneDnnHead over it when it is a float32 CPU nn.Linear that oneDNN computes faster
    at row_counts (the rows one call projects: 1 for a decode step, 1 + k for a verify round)."""
    if not isinstance(head, nn.Linear) or head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return head
    return OneDnnHead(head) if faster_on_this_cpu(head.weight, row_counts) else head


def head_backend(model: nn.Module) -> str:
    """'oneDNN' or 'default': how `model.lm_head` computes (reports record it beside their speeds)."""
    return "oneDNN" if isinstance(getattr(model, "lm_head", None), OneDnnHead) else "default"
