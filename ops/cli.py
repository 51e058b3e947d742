"""The `dspark` command line.

Each subcommand lives in its own module under `dspark.ops.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int` as the handler.
Bad input is reported as one clear line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from dspark.models.errors import DsparkError

# Subcommand modules, in the order `dspark --help` lists them.
COMMANDS = ("embedded_target", "train", "self_chat", "check", "provide_target", "generate", "eval", "calibrate",
            "profile_sps", "demo", "bench", "bench_sched", "serve", "admin_server", "admin", "bench_serve",
            "bench_trace", "soak", "gpu_check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark",
        description="DSpark speculative decoding: build the embedded target, train drafters, check checkpoints.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"dspark.ops.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DsparkError as err:
        print(f"dspark {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
