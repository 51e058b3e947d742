"""FSDP2 for the drafter (`dspark train --fsdp` under torchrun): its trainable parameters, their gradients and
the AdamW state are sharded over the ranks instead of replicated as DDP replicates them.

The whole training module is one `fully_shard` unit: DSpark's forward reads each layer's K/V projections outside
that layer's own forward (the injected context), so per-layer units would hand it sharded weights; one unit gathers
every trainable weight for the forward and the backward and frees them after. The frozen embedding and lm_head are
the target's own tensors, shared with the target's forward, so they stay out (`ignored_params`). Gradients are
reduce-scattered as averages, as DDP all-reduces them, so the trainer's loss scaling is the same.

Checkpoints and the export need the full tensors: `full_state` gathers them (a collective: every rank calls it) onto
rank 0's CPU, the same layout a single process saves; `load_full_state` puts them back on every rank.
"""
from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_optimizer_state_dict,
                                                     set_model_state_dict)
from torch.distributed.fsdp import fully_shard

PREFIX = "drafter."  # the trainer's module holds the drafter under this name


def shard_for_training(module: torch.nn.Module) -> torch.nn.Module:
    fully_shard(module, ignored_params={p for p in module.parameters() if not p.requires_grad})
    return module


def full_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(the drafter's state dict, the optimizer's) with full tensors on rank 0's CPU, empty on other ranks."""
    model_state, optimizer_state = get_state_dict(
        module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix(PREFIX): v for k, v in model_state.items()}, optimizer_state


def load_full_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, drafter_state: dict,
                    optimizer_state: dict) -> None:
    """full_state's pair, read by every rank, back into the sharded module and its optimizer."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, {PREFIX + k: v for k, v in drafter_state.items()}, options=options)
    set_optimizer_state_dict(module, optimizer, optimizer_state, options=options)
