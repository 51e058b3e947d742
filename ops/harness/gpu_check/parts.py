"""The gpu-check's parts in order, at the sizes of the device they run on, each turned into rows of the table
whatever happens: a part that raises gives rows that say so, one that would start past the deadline is skipped."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from dspark.models.decoding.loading import Target, load_target
from dspark.ops.harness.gpu_check.engine_rows import EngineShapes, engine_rows
from dspark.ops.harness.gpu_check.engine_rows import checks as engine_checks
from dspark.ops.harness.gpu_check.flashinfer_row import CHECK as FLASHINFER_CHECK
from dspark.ops.harness.gpu_check.flashinfer_row import flashinfer_row
from dspark.ops.harness.gpu_check.kernel_rows import OPS, KernelShapes, kernel_rows
from dspark.ops.harness.gpu_check.table import ERROR, Row, described, skipped
from dspark.ops.harness.gpu_check.training_row import CHECK as TRAINING_CHECK
from dspark.ops.harness.gpu_check.training_row import TrainingShapes, training_row


@dataclass(frozen=True)
class Sizes:
    kernels: KernelShapes
    engine: EngineShapes
    training: TrainingShapes


SIZES = {
    # Qwen3's vocabulary and a gamma of 7 for the kernels; the embedded models are what they are
    "cuda": Sizes(KernelShapes(batch_sizes=(1, 64), gamma=7, vocab=151936, markov_rank=256, iters=20, compiled=True),
                  EngineShapes(prompts=8, batch_size=8, max_new_tokens=64, repeats=5),
                  TrainingShapes(batch_size=32, prompt_len=32, response_len=128, n_anchors=32, warm_up_steps=3,
                                 timed_steps=20, bf16=True)),
    # the dry run: every code path once, small enough for CI's two cores
    "cpu": Sizes(KernelShapes(batch_sizes=(4,), gamma=4, vocab=512, markov_rank=32, iters=3, compiled=False),
                 EngineShapes(prompts=2, batch_size=2, max_new_tokens=8, repeats=1),
                 TrainingShapes(batch_size=2, prompt_len=8, response_len=24, n_anchors=4, warm_up_steps=1,
                                timed_steps=1, bf16=False)),
}


def check_rows(device: torch.device, target_dir: Path, drafter_dir: Path, deadline: float) -> list[Row]:
    sizes = SIZES[device.type]
    kernels = sizes.kernels
    loaded: list[Target] = []  # the target, loaded by the first part that needs it

    def target() -> Target:
        if not loaded:
            loaded.append(load_target(target_dir, str(device), cpu_linears="default"))
        return loaded[0]

    kernel_checks = [f"{op}: dspark Triton vs PyTorch reference" for op in OPS]
    return (part(kernel_checks, lambda: kernel_rows(device, kernels), deadline)
            + part([FLASHINFER_CHECK], lambda: [flashinfer_row(device, max(kernels.batch_sizes), kernels.gamma,
                                                                kernels.vocab, kernels.iters)], deadline)
            + part(engine_checks(), lambda: engine_rows(target(), drafter_dir, sizes.engine), deadline)
            + part([TRAINING_CHECK], lambda: [training_row(target(), drafter_dir, sizes.training)], deadline))


def part(checks: list[str], rows: Callable[[], list[Row]], deadline: float) -> list[Row]:
    if time.perf_counter() > deadline:
        return skipped(checks, "", "the time budget (--budget-s) was spent before this part")
    try:
        return rows()
    except Exception as error:  # one part's failure is its rows' result; the table still comes out
        return [Row(check, "", ERROR, notes=described(error)) for check in checks]
