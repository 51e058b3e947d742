"""FSDP2 for the drafter (`dspark train --fsdp` under torchrun): its trainable parameters, their gradients and
the AdamW state are sharded over the ranks instead of replicated as DDP replicates them.

The whole training module is one `fully_shard` unit: DSpark's forward reads each layer's K/V projections outside
that layer's own forward (the injected context), so per-layer units would hand it sharded weights; one unit gathers
every trainable weight for the forward and the backward and frees them after. The frozen embedding and lm_head are
the target's own tensors, shared with the target's forward, so they stay out (`ignored_params`). Gradients are
reduce-scattered as averages, as DDP all-reduces them, so the trainer's loss scaling is the same.

Checkpoints and the export need the full tensors: `full_state` gathers them (a collective: every rank calls it) onto
rank 0's CPU, the same layout a single process saves; `load_full_state` puts them back on every rank.

FSDP2 for the frozen target (`dspark train --shard-target`), for a target that does not fit on one device: each
decoder layer is its own `fully_shard` unit, so a rank holds 1/world of every layer and gathers one layer at a time
for its forward, freeing it after (the whole target is never on one device). The embedding, the final norm and the
lm_head stay whole on every rank: the drafter's losses and the feature store read them directly. A sharded layer's
forward is a collective, so every rank must run the target's forwards together (run.py keeps them in step).
"""
from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_optimizer_state_dict,
                                                     set_model_state_dict)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from dspark.models.target_features import decoder_layers

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


def world_mesh(device: torch.device, world_size: int) -> DeviceMesh:
    """The 1-D mesh over every rank that shard_frozen_target shards over (made once, by every rank together)."""
    return init_device_mesh(device.type, (world_size,))


def shard_frozen_target(target: torch.nn.Module, mesh: DeviceMesh, device: torch.device) -> torch.nn.Module:
    """`target` (whole, on the CPU) with every decoder layer sharded over `mesh` onto `device` and the rest (embedding,
    final norm, lm_head, rotary buffers) moved there whole (module docstring)."""
    decoder, layers = target.get_decoder(), decoder_layers(target)
    decoder.layers = torch.nn.ModuleList()  # out of the way while the rest moves whole
    target.to(device)
    decoder.layers = layers
    for layer in layers:
        fully_shard(layer, mesh=mesh)  # moves the layer to the mesh's device, keeps this rank's shard
    return target
