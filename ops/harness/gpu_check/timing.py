"""Median wall time of one call, in milliseconds: CUDA events on a GPU (the launch is asynchronous), the host's
clock on a CPU."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

WARM_UP_CALLS = 3  # the first calls compile the Triton kernels and size PyTorch's caches


def median_ms(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    for _ in range(WARM_UP_CALLS):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)

