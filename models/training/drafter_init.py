"""Start a drafter from a trained one of the same architecture (`dspark train --init-from-drafter DIR`).

Fine-tuning: a drafter trained on one prompt distribution meets another in use (templated training prompts,
real users' questions). Training it further on the target's replies to the new prompts costs a fraction of the
steps training from the target's top layers takes. The trained drafter must match the job's drafter exactly
(kind, sizes, tapped layers, heads); a mismatch is refused naming the settings that differ.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dspark.models.checkpoint import differing_settings, load_drafter, read_drafter_config
from dspark.models.drafters import Drafter, DrafterConfig
from dspark.models.drafters.draft_vocab import load_draft_vocab
from dspark.models.errors import ConfigError


def check_same_drafter(directory: Path, config: DrafterConfig, target_config) -> None:
    """Refuse a checkpoint at `directory` whose drafter is not the one `config` describes (cheap: reads its config
    only, so a job fails before it generates any data)."""
    differing = differing_settings(config, read_drafter_config(directory, target_config), "this job")
    if differing:
        raise ConfigError(f"--init-from-drafter {directory} is another drafter than this job trains: "
                          + ", ".join(differing))
    load_draft_vocab(directory, config.vocab_size)  # the fine-tune keeps it: a malformed one fails here, not later


@torch.no_grad()
def init_from_drafter(drafter: Drafter, directory: Path, target: nn.Module) -> None:
    """Copy the weights of the drafter checkpoint at `directory` into `drafter` (the caller has run
    check_same_drafter on it first, before the job's data was generated)."""
    trained = load_drafter(directory, target.config, target_model=target, device=drafter.device)
    drafter.load_state_dict(trained.state_dict())
