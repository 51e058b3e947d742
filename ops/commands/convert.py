"""`dspark convert`: rewrite another trainer's drafter checkpoint into the layout SGLang serves as trained.

    dspark convert --in speculators-export/ --out drafters/mine

Identifies the source's convention (DeepSpec, SGLang Eagle3, a SpecForge export, vllm-project/speculators with
its slot layout; models/checkpoint_conventions.py), rewrites its config.json and weight names into the DeepSpec
layout `dspark serve` accepts (models/checkpoint_convert.py) and checks the result as serve will. The tensors are
copied unchanged. A checkpoint it cannot identify, or one that contradicts itself, exits with status 2 and a line
naming what it found; `--out` must be new or empty.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dspark.models.checkpoint import read_drafter_config
from dspark.models.checkpoint_convert import convert_checkpoint


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("convert", help="rewrite a drafter from another trainer's layout into SGLang's",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--in", dest="source", type=Path, required=True,
                        help="the checkpoint directory to convert (config.json + model.safetensors)")
    parser.add_argument("--out", type=Path, required=True, help="a new or empty directory for the result")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    convention = convert_checkpoint(args.source, args.out)
    config = read_drafter_config(args.out)
    layout = "autoregressive" if config.kind == "eagle3" else (
        f"a block of {config.block_slots} slots, "
        + ("slot k predicts anchor + k + 1" if config.sample_from_anchor else "slot j predicts anchor + j"))
    done = "copied unchanged: already served as trained" if convention.served else "converted"
    print(f"{args.source}: {convention.name} checkpoint ({convention.trainer}; {convention.slots})")
    print(f"{args.out}: {done}; {config.kind} drafter, gamma {config.gamma} ({layout}), "
          f"target_layer_ids {list(config.target_layer_ids)}")
    return 0
