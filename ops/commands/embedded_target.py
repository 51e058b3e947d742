"""`dspark embedded-target`: train the embedded target model from the CPython standard library.

Lists and splits the stdlib corpus, trains the byte-level BPE and the Qwen3 target, evaluates held-out
perplexity and writes weights, tokenizer, model card and train_log.json to --out. The card records the
full command line (every option spelled out) so the run can be repeated exactly.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dspark.models.embedded_target.corpus import (DEFAULT_HELD_OUT_PERCENT, HELD_OUT_PERCENT_RANGE, default_stdlib_root,
                                                   load_corpus)
from dspark.models.embedded_target.train import TargetArchitecture, TrainSettings, train_target
from dspark.ops.arg_types import BATCH, SEED, finite_float, int_in, output_dir
from dspark.ops.commands.reproduce import reproduce_command
from dspark.ops.commands.threads import add_threads_arg, use_threads

# option name -> (TargetArchitecture field, argparse type with its bounds, help). The bounds keep every tensor
# of a model this command can train on one machine (the dataclasses check the relations between fields).
WIDTH = int_in(1, 65536)
ARCH_OPTIONS = {
    "hidden": ("hidden_size", WIDTH, "model width"),
    "layers": ("num_layers", int_in(1, 256), "decoder layers"),
    "heads": ("num_heads", int_in(1, 256), "attention heads"),
    "kv-heads": ("num_kv_heads", int_in(1, 256), "key/value heads (grouped-query attention)"),
    "head-dim": ("head_dim", int_in(1, 1024), "dimension per head"),
    "intermediate": ("intermediate_size", WIDTH, "MLP hidden size"),
    "vocab": ("vocab_size", int_in(1, 1 << 20), "BPE vocabulary size, special tokens included"),
}
STEPS = int_in(1, 10**9)
# option name -> (TrainSettings field, argparse type with its bounds, help)
TRAIN_OPTIONS = {
    "steps": ("max_steps", STEPS, "stop after this many optimizer steps"),
    "minutes": ("max_minutes", finite_float, "stop after this many minutes of training (the LR schedule follows the "
                                             "clock)"),
    "seed": ("seed", SEED, "seed of initialisation and batch sampling"),
    "lr": ("lr", finite_float, "peak learning rate"),
    "batch-size": ("batch_size", BATCH, "sequences per step"),
    "seq-len": ("seq_len", WIDTH, "tokens per sequence"),
    "warmup-steps": ("warmup_steps", int_in(0, 10**9), "linear warmup steps"),
    "eval-every": ("eval_every", int_in(0, 10**9), "steps between quick held-out checks (0: none)"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "embedded-target",
        help="train the embedded Qwen3 target on the CPython stdlib",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--out", type=output_dir, default=Path("embedded/target"), help="output directory")
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib root (default: this interpreter's)")
    parser.add_argument("--held-out-percent", type=int_in(*HELD_OUT_PERCENT_RANGE), default=DEFAULT_HELD_OUT_PERCENT)
    add_threads_arg(parser)
    _add_dataclass_options(parser, ARCH_OPTIONS, TargetArchitecture)
    _add_dataclass_options(parser, TRAIN_OPTIONS, TrainSettings)
    parser.set_defaults(func=handle, _parser=parser)


def _add_dataclass_options(parser: argparse.ArgumentParser, options: dict, config_class: type) -> None:
    """One option per config field, its default from the dataclass field."""
    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    for name, (field_name, kind, help_text) in options.items():
        default = defaults[field_name]
        parser.add_argument(f"--{name}", type=kind, default=default, help=f"{help_text} (default: {default})")


def _from_options(args: argparse.Namespace, options: dict) -> dict:
    return {field: getattr(args, name.replace("-", "_")) for name, (field, _, _) in options.items()}


def handle(args: argparse.Namespace) -> int:
    arch = TargetArchitecture(**_from_options(args, ARCH_OPTIONS))
    settings = TrainSettings(**_from_options(args, TRAIN_OPTIONS))
    corpus = load_corpus(args.stdlib or default_stdlib_root(), args.held_out_percent)
    use_threads(args)
    log = train_target(corpus, arch, settings, args.out, reproduce_command("embedded-target", args._parser, args))
    print(
        f"wrote {args.out}: {log['parameters']:,} params, {log['steps']} steps, {log['tokens_seen']:,} tokens, "
        f"{log['train_seconds'] / 60:.1f} min, held-out perplexity {log['held_out_perplexity']:.2f}"
    )
    return 0
