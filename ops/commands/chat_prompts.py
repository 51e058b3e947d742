"""`dspark chat-prompts`: the built-in generated chat prompts as a prompts file, for `dspark regenerate`.

    dspark chat-prompts --count 5000 --seed 8 --out prompts.jsonl
    dspark regenerate --input prompts.jsonl --out replies.jsonl --target DIR

models/training/chat_prompts.py says what they are (math, code and general user turns from templates over the
standard library, none equal or near to an evaluation prompt). The same count, seed and standard library give the
same file: {"turns": [text]} JSONL, one record a line.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dspark.models.embedded_target.corpus import default_stdlib_root, load_corpus
from dspark.models.errors import ConfigError
from dspark.models.training.chat_prompts import MIN_CHAT_PROMPTS, generate_chat_prompts, write_prompts
from dspark.ops.arg_types import SEED, output_file

MAX_COUNT = 1_000_000


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat-prompts", help="write the built-in generated chat prompts to a file",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, required=True,
                        help=f"distinct prompts to write ({MIN_CHAT_PROMPTS} to {MAX_COUNT})")
    parser.add_argument("--seed", type=SEED, default=0, help="which draw (dspark train's built-in set is seed 0)")
    parser.add_argument("--out", type=output_file, required=True, help=".jsonl file to write")
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib root (default: this interpreter's)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not MIN_CHAT_PROMPTS <= args.count <= MAX_COUNT:
        raise ConfigError(f"--count must be in [{MIN_CHAT_PROMPTS}, {MAX_COUNT}], got {args.count}")
    records = generate_chat_prompts(load_corpus(args.stdlib or default_stdlib_root()), args.count, seed=args.seed)
    write_prompts(records, args.out)
    print(f"wrote {len(records)} chat prompts (seed {args.seed}) to {args.out}")
    return 0
