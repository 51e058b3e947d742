"""The vocabulary head the engine runs on CPU: oneDNN's linear where it measures faster than MKL's.

The lm_head is the largest single product of a decode step, a verify round and a drafting pass (SmolLM2: 49152 x
576 of the target's 135M parameters), and PyTorch's default CPU path for it is slow at the few rows decoding asks
for on some CPUs (kernels/onednn_linear.py). `fastest_head` times both paths on the head itself at the row
counts it will see and swaps in `OneDnnHead` only when oneDNN wins at the smallest; that head sends calls of more
rows than the last count oneDNN won to the default path, so a CPU where MKL is faster keeps MKL where it is.
The head is frozen during decoding; the swap never touches a GPU or a non-float32 head.
"""
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dspark.kernels.onednn_linear import onednn_linear, onednn_wins_up_to, pack


class OneDnnHead(nn.Module):
    """A frozen nn.Linear computed by oneDNN for calls of at most max_rows rows, by PyTorch's default path for
    larger ones. It keeps the linear's own Parameter as `.weight` (a tied embedding and anything reading the
    head's weight see no change) beside the packed copy oneDNN uses."""

    def __init__(self, linear: nn.Linear, max_rows: int):
        super().__init__()
        self.weight, self.bias, self.max_rows = linear.weight, linear.bias, max_rows
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = pack(linear.weight)  # a plain attribute: not saved in a state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // x.shape[-1] > self.max_rows:
            return F.linear(x, self.weight, self.bias)
        return onednn_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"oneDNN up to {self.max_rows} rows")


def fastest_head(head: nn.Module, row_counts: Sequence[int]) -> nn.Module:
    """`head` itself, or an OneDnnHead over it when it is a float32 CPU nn.Linear that oneDNN computes faster
    at the smallest of row_counts (the rows one call projects: 1 for a decode step, 1 + k per request in a
    verify round), oneDNN up to the last of them it computes faster at."""
    if not isinstance(head, nn.Linear) or head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return head
    max_rows = onednn_wins_up_to(head.weight, row_counts)
    return OneDnnHead(head, max_rows) if max_rows else head


def head_backend(model: nn.Module) -> str:
    """'oneDNN' or 'default': how `model.lm_head` computes (reports record it beside their speeds)."""
    return "oneDNN" if isinstance(getattr(model, "lm_head", None), OneDnnHead) else "default"
