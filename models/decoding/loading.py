"""Load a target and a drafter for decoding, with the checks that give bad input a clear error.

The target loads in float32 (CPU matmuls in bf16 are slow without AMX; a GPU run may pass another dtype). The
drafter loads through checkpoint.load_drafter, which refuses one that does not fit the target, and takes the
target's dtype and device.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoModelForCausalLM

from dspark.models.checkpoint import load_drafter
from dspark.models.drafters.base import Drafter
from dspark.models.evaluation.datasets import stop_token_ids
from dspark.models.training.run import load_target_config


@dataclass(frozen=True)
class Target:
    model: torch.nn.Module
    tokenizer: object
    eos_token_ids: tuple
    path: Path


def load_target(directory: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Target:
    directory = Path(directory)
    config, tokenizer = load_target_config(directory)  # CheckpointError when there is no config.json
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).to(device).eval()
    return Target(model=model, tokenizer=tokenizer, eos_token_ids=stop_token_ids(model, tokenizer), path=directory)


def load_drafter_for(directory: Optional[Path], target: Target) -> Optional[Drafter]:
    """The drafter at `directory` checked against the target (None: no speculation)."""
    if directory is None:
        return None
    parameter = next(target.model.parameters())
    return load_drafter(Path(directory), target.model.config, dtype=parameter.dtype, device=parameter.device,
                        target_model=target.model)  # slim checkpoints take the target's embedding / lm_head
