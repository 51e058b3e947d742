"""`dspark regenerate`: the target rewrites every assistant turn of a conversations file (docs/training.md).

    dspark regenerate --input chats.jsonl --out regen.jsonl --target DIR                  # SGLang's offline Engine
    dspark regenerate --input chats.jsonl --out regen.jsonl --endpoint http://host:30000  # any OpenAI-compatible one
    dspark train --target DIR --drafter dspark --data regen.jsonl ...

Input: JSONL in ShareGPT, OpenAI messages or plain prompts layout (models/training/conversations.py). Output:
one record a conversation, appended as each finishes; run the same command again after a kill and it continues
with the conversations not yet written (models/training/regenerate.py). Arguments after `--` go to SGLang's
Engine unchanged (e.g. `-- --dp-size 8` for data parallelism over 8 GPUs).
"""
from __future__ import annotations

import argparse
import asyncio
from dataclasses import fields
from pathlib import Path

from dspark.models.errors import ConfigError
from dspark.models.training.conversations import read_conversations
from dspark.models.training.regenerate import ReplySampling, regenerate
from dspark.ops.admin.security import read_secret
from dspark.ops.arg_types import finite_float, http_url, int_in, output_file

DEFAULT_CONCURRENCY = 64
SAMPLING_TYPES = {"temperature": finite_float, "top_p": finite_float, "top_k": int, "max_new_tokens": int}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("regenerate", help="the target rewrites every assistant turn of a conversations "
                                   "file (training data for `dspark train --data`)",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="JSONL: ShareGPT, OpenAI messages or prompts")
    parser.add_argument("--out", type=output_file, required=True, help="JSONL output (appended to; a rerun resumes)")
    backend = parser.add_mutually_exclusive_group(required=True)
    backend.add_argument("--target", type=Path, help="run SGLang's offline Engine on this model directory")
    backend.add_argument("--endpoint", type=http_url,
                         help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--model", default=None, help="--endpoint: the model name (default: its first model)")
    parser.add_argument("--api-key-file", type=Path, default=None, help="--endpoint: a file holding its API key")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="--target: where the Engine runs (default: cuda if available)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="conversations in flight")
    parser.add_argument("--limit", type=int_in(1, 100_000_000), default=None,
                        help="only the first N conversations of --input")
    defaults = ReplySampling()
    for field in fields(ReplySampling):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=SAMPLING_TYPES[field.name],
                            default=getattr(defaults, field.name), help=f"default {getattr(defaults, field.name)}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("engine_args", nargs=argparse.REMAINDER, help="after --: arguments for SGLang's Engine")
    parser.set_defaults(func=handle)


def make_backend(args: argparse.Namespace, api_key: str | None):
    from dspark.integration.reply_backends import OfflineEngine, OpenAIChatEndpoint

    extra = [a for a in args.engine_args if a != "--"]
    if args.endpoint is not None:
        if extra:
            raise ConfigError("arguments after -- go to SGLang's Engine (--target), not to an --endpoint")
        return OpenAIChatEndpoint(args.endpoint, args.model, api_key)
    if not args.target.is_dir():
        raise ConfigError(f"--target {args.target} is not a model directory")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return OfflineEngine(args.target, cpu=device == "cpu", extra_args=extra)


async def run(args: argparse.Namespace, sampling: ReplySampling, conversations, api_key: str | None) -> None:
    summary = await regenerate(conversations, lambda: make_backend(args, api_key), args.out, sampling, args.concurrency,
                               progress=not args.no_progress)
    print(f"wrote {args.out}: {summary.conversations} conversations regenerated ({summary.skipped} already there), "
          f"{summary.reply_tokens} reply tokens in {summary.wall_s:.1f} s, {summary.tokens_per_s:.1f} tokens/s")


def handle(args: argparse.Namespace) -> int:
    if (args.api_key_file is not None or args.model is not None) and args.endpoint is None:
        raise ConfigError("--api-key-file and --model are read with --endpoint only")
    api_key = read_secret(args.api_key_file, "--api-key-file") if args.api_key_file is not None else None
    if args.device is not None and args.target is None:
        raise ConfigError("--device is where --target's Engine runs; an --endpoint runs where it is served")
    sampling = ReplySampling(**{f.name: getattr(args, f.name) for f in fields(ReplySampling)})
    conversations = read_conversations(args.input, limit=args.limit)
    asyncio.run(run(args, sampling, conversations, api_key))
    return 0
