"""A drafter training step's throughput on the device: the embedded DSpark drafter's recipe, freshly initialised.

Each step is what `dspark train` runs without a feature cache (models/training/trainer.py): the frozen target's
forward for its hidden states and logits, the drafter's forward over the sampled anchor blocks, the DSpark loss,
backward, gradient clipping and AdamW. The samples are random tokens (throughput does not read them). Warm-up
steps first, then the timed steps between two device synchronisations; tokens/s counts every position of every
sample, as the recipe's --prompt-len + --response-len.
"""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.models.checkpoint import read_drafter_config
from dspark.models.decoding.loading import Target
from dspark.models.decoding.sps_profile import synchronize
from dspark.models.drafters import DRAFTER_CLASSES
from dspark.models.training.data import TokenDataset
from dspark.models.training.run import build_task
from dspark.models.training.trainer import DistContext, TrainConfig, Trainer
from dspark.ops.harness.gpu_check.table import FAILED, PASSED, Row

CHECK = "training: one drafter optimizer step (target forward + drafter forward/backward + AdamW)"


@dataclass(frozen=True)
class TrainingShapes:
    batch_size: int
    prompt_len: int  # untrained positions at the start of each sample
    response_len: int  # trained positions after them
    n_anchors: int  # blocks sampled per sequence
    warm_up_steps: int
    timed_steps: int
    bf16: bool  # bf16 autocast of both forwards (`dspark train --bf16`)


def training_row(target: Target, drafter_dir: Path, shapes: TrainingShapes) -> Row:
    device = next(target.model.parameters()).device
    config = read_drafter_config(drafter_dir, target.model.config)
    torch.manual_seed(0)
    drafter = DRAFTER_CLASSES[config.kind].from_target(target.model, config).to(device)
    seq_len = shapes.prompt_len + shapes.response_len
    samples = 2 * shapes.batch_size
    generator = torch.Generator().manual_seed(0)
    dataset = TokenDataset(input_ids=torch.randint(config.vocab_size, (samples, seq_len), generator=generator),
                           loss_mask=(torch.arange(seq_len) >= shapes.prompt_len).expand(samples, -1).clone(),
                           attention_mask=torch.ones(samples, seq_len, dtype=torch.bool))
    steps = shapes.warm_up_steps + shapes.timed_steps
    train = TrainConfig(steps=steps, batch_size=shapes.batch_size, bf16=shapes.bf16)
    setup = (f"{device}, {config.kind} {config.num_hidden_layers} layers, batch {shapes.batch_size} x {seq_len} "
             f"tokens, {shapes.n_anchors} blocks/seq, {'bf16 autocast' if shapes.bf16 else 'float32'}")
    with tempfile.TemporaryDirectory() as unused_out:  # the trainer's checkpoint folder: one step writes none
        trainer = Trainer(drafter, target.model, dataset, build_task(config, shapes.n_anchors), train,
                          Path(unused_out), DistContext(device=device), progress=False)
        drafter.train()
        for _ in range(shapes.warm_up_steps):
            trainer.optimizer_step()
        synchronize(device)
        began = time.perf_counter()
        for _ in range(shapes.timed_steps):
            terms = trainer.optimizer_step()
        synchronize(device)
        seconds = time.perf_counter() - began
    finite = all(math.isfinite(value) for value in terms.values())
    rate = shapes.timed_steps * shapes.batch_size * seq_len / seconds
    notes = f"{1e3 * seconds / shapes.timed_steps:.1f} ms a step, loss {terms['loss']:.3f}"
    return Row(CHECK, setup, PASSED if finite else FAILED, None, "", f"{rate:.0f} tok/s",
               notes if finite else "a loss term is not finite: " + notes)
