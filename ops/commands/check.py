"""`dspark check`: does this drafter checkpoint load, and does it fit this target?

    dspark check embedded/dspark --target embedded/target

Reads the drafter's config and checks it against the target's config first, before any weights (the target's
too) are read. Then loads the checkpoint exactly as serving and decoding will (dspark.models.checkpoint.load_drafter,
which checks hidden size, vocab, target layer ids, mask token and every weight against the target) and prints what
it is.
A checkpoint that does not fit exits with status 2 and one line naming every mismatch. A slim checkpoint (no
frozen embedding / lm_head copies) is completed from the target's weights, as decoding does. The first line names
the trainer's layout the checkpoint is in (models/checkpoint_conventions.py); one that SGLang would not serve as
trained (a speculators export, whose slots it would read shifted; a SpecForge export) exits 2 naming
`dspark convert`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from transformers import AutoModelForCausalLM

from dspark.models.checkpoint import (architecture, checkpoint_convention, load_drafter, read_drafter_config,
                                      taken_from_target)
from dspark.models.drafters.draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab
from dspark.models.target_io import load_target_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("check", help="check that a drafter checkpoint loads and fits a target",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("drafter", type=Path, help="drafter checkpoint directory (config.json + model.safetensors)")
    parser.add_argument("--target", type=Path, required=True, help="the target model directory (its config.json)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target_config, _ = load_target_config(args.target)
    # Which trainer's layout it is, named first: one SGLang would serve wrong is then refused with the convert command
    convention = checkpoint_convention(args.drafter)
    print(f"{args.drafter}: {convention.name} layout ({convention.trainer}; {convention.slots})", flush=True)
    # The drafter's config, and whether it fits the target's config, before any weights are read: a bad config
    # is named in a moment, not after a large target's weights were loaded for nothing (and it names the files)
    read_drafter_config(args.drafter, target_config)
    taken = taken_from_target(args.drafter)
    target_model = AutoModelForCausalLM.from_pretrained(args.target) if taken else None
    drafter = load_drafter(args.drafter, target_config, target_model=target_model)
    cfg = drafter.config
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    print(f"{args.drafter}: {cfg.kind} drafter ({architecture(cfg)}), fits target {args.target}")
    print(f"  gamma {cfg.gamma}, layers {cfg.num_hidden_layers}, target_layer_ids {list(cfg.target_layer_ids)}, "
          f"mask_token_id {cfg.mask_token_id}")
    token_ids = load_draft_vocab(args.drafter, cfg.vocab_size)
    if token_ids is not None:
        print(f"  draft vocabulary: {len(token_ids)} of {cfg.vocab_size} tokens ({DRAFT_VOCAB_FILE})")
    if cfg.markov_rank:
        print(f"  markov head {cfg.markov_head_type} rank {cfg.markov_rank}, "
              f"confidence head {'on' if cfg.enable_confidence_head else 'off'}")
    shared = f" ({', '.join(taken)} taken from the target)" if taken else ""
    print(f"  {trainable / 1e6:.2f}M trainable parameters, dtype {drafter.dtype}{shared}")
    return 0
