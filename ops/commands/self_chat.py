"""`dspark self-chat`: user turns written by the target itself, as a prompts file for `dspark train`.

    dspark self-chat --target DIR --count 600 --out self_chat.jsonl
    dspark train --data-source chat --prompts-file self_chat.jsonl --builtin-prompts 600 ...

models/training/self_chat.py says how (the target opens a user turn in its own chat template and writes it).
Records are {"turns": [text], "batch": b, "sampling": {...}} JSONL, one per line, in the order drawn, appended as
each batch ends; the same settings give the same file. Run it again after a kill, or with a larger --count, and it
goes on from the last batch written, to the file an uninterrupted run writes.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dspark.models.target_io import load_frozen_target, load_target_config, target_fingerprint
from dspark.models.training.self_chat import (TurnSampling, record_line, resume_point, user_turn_batches,
                                               user_turn_opening)
from dspark.models.training.trainer import bf16_autocast
from dspark.ops.arg_types import output_file
from dspark.ops.commands.threads import add_threads_arg, use_threads


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("self-chat", help="sample chat prompts (user turns) from the target itself",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True, help="transformers chat model directory")
    parser.add_argument("--count", type=int, required=True, help="distinct user turns to write")
    parser.add_argument("--out", type=output_file, required=True, help=".jsonl file to write, or to resume")
    parser.add_argument("--max-tokens", type=int, default=TurnSampling.max_tokens,
                        help="a turn not closed within this many is dropped")
    parser.add_argument("--batch-size", type=int, default=TurnSampling.batch_size, help="turns sampled together")
    parser.add_argument("--seed", type=int, default=TurnSampling.seed)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (faster on AMX; other samples)")
    add_threads_arg(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    use_threads(args)
    sampling = TurnSampling(args.count, args.max_tokens, args.batch_size, args.seed, args.bf16)
    _, tokenizer = load_target_config(args.target)
    user_turn_opening(tokenizer)  # a target without chat turns is refused before its weights load
    recorded = sampling.recorded(target_fingerprint(args.target))
    drawn, first_batch = resume_point(args.out, recorded)
    if len(drawn) >= args.count:
        print(f"{args.out} already holds {len(drawn)} user turns (--count {args.count}): nothing to do")
        return 0
    device = torch.device("cpu")
    target = load_frozen_target(args.target, device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with bf16_autocast(args.bf16, device), args.out.open("a", encoding="utf-8") as sink:
        for batch, added in user_turn_batches(target, tokenizer, sampling, tuple(drawn), first_batch):
            sink.write("".join(record_line(turn, batch, recorded) for turn in added))
            sink.flush()
    print(f"wrote {args.count - len(drawn)} user turns to {args.out} ({args.count} in all)")
    return 0
