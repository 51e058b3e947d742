"""The `dspark` command line.

Each subcommand lives in its own module, under `dspark.ops.commands` (what users run) or `dspark.ops.harness`
(benchmarks, the soak and the GPU check), and exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int` as the handler. `dspark NAME ...` imports NAME's module alone, so that a light command (the
admin sidecar, say) does not load what the training or plotting commands need; `dspark --help` and a name that
is not a command load them all (`dspark --version`, none). Bad input is reported as one clear line on stderr and
exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from dspark.models.errors import DsparkError

# `dspark NAME` -> the module that registers it, in the order `dspark --help` lists them.
COMMANDS = {name: f"dspark.ops.{folder}.{name.replace('-', '_')}" for folder, names in (
    ("commands", ("embedded-target", "train", "self-chat", "chat-prompts", "regenerate", "check", "convert",
                  "provide-target", "generate", "eval", "calibrate", "profile-sps", "demo", "serve", "admin-server", "admin")),
    ("harness", ("bench", "bench-sched", "bench-serve", "bench-trace", "soak", "gpu-check"))) for name in names}


# What a bug report needs: dspark's version and those of the stack it runs on.
REPORTED_PACKAGES = ("dspark", "sglang", "torch", "transformers")


def versions() -> str:
    """`dspark 0.1.0, sglang 0.5.23, ...` for the installed packages (a missing one: "not installed")."""
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    return ", ".join(f"{name} {version(name)}" for name in REPORTED_PACKAGES)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with only the command argv names registered, or every command (argv None, a help
    request before any command, or an unknown command, which argparse then reports with the list)."""
    parser = argparse.ArgumentParser(
        prog="dspark",
        description="DSpark speculative decoding: build the embedded target, train drafters, check checkpoints.",
    )
    parser.add_argument("--version", action="version", version=versions())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((arg for arg in argv or () if not arg.startswith("-")), None)
    if chosen in COMMANDS:
        names = [chosen]
    else:
        names = [] if chosen is None and "--version" in (argv or ()) else COMMANDS
    for name in names:
        importlib.import_module(COMMANDS[name]).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DsparkError as err:
        print(f"dspark {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
