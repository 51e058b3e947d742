"""--threads, shared by the commands that run torch on the CPU."""
from __future__ import annotations

import argparse

import torch

from dspark.models.errors import ConfigError


def add_threads_arg(parser) -> None:
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")


def use_threads(args: argparse.Namespace) -> None:
    """Check --threads and set torch's CPU thread count to it."""
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
