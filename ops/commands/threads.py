"""--threads, shared by the commands that run torch on the CPU."""
from __future__ import annotations

import argparse

import torch

from dspark.ops.arg_types import THREADS


def add_threads_arg(parser) -> None:
    parser.add_argument("--threads", type=THREADS, default=2, help="torch CPU threads")


def use_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count to --threads (bounded as argparse parsed it)."""
    torch.set_num_threads(args.threads)
