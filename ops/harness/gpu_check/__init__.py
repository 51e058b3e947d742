"""`make gpu-check` (`dspark gpu-check`): the first thing to run on a lent GPU machine, one table in <= 8 minutes.

    make gpu-check [GPU_PYTHON=python3] [GPU_CHECK_OUT=bench/results/gpu-check]

It runs from the repo as sent, on the machine's own torch, Triton and transformers (scripts/gpu_check.sh: no
install, no network, no wheels), and checks in order:
1. kernels     dspark's Triton kernels against their PyTorch references, timed (kernel_rows.py);
2. flashinfer  FlashInfer's chain sampling where it imports, else why it is not there (flashinfer_row.py);
3. engine      the embedded target decoding with embedded/dspark: greedy output identical to the target
               alone's, the speedup and tau (engine_rows.py);
4. training    a drafter training step's throughput (training_row.py).
Without a CUDA device it is the dry run CI runs (tests/ops/commands/test_gpu_check_command.py): the kernels run
under Triton's interpreter at small sizes, untimed; the engine and the training step run on the CPU at small
sizes; FlashInfer is skipped; every skipped part names its reason. A part that would start after --budget-s is
skipped with that reason, so the table always comes out. The table goes to stdout (everything else to stderr);
--out keeps it as gpu_check.md and gpu_check.json. Exit status 1 when a check failed or raised.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from dspark.models.errors import ConfigError
from dspark.ops.arg_types import finite_float, output_dir

REPO = Path(__file__).resolve().parents[3]
TARGET, DRAFTER = REPO / "embedded" / "target", REPO / "embedded" / "dspark"
BUDGET_S = 420.0  # the parts start within 7 minutes; the last one and the table fit in the 8th
MAX_BUDGET_S = 86400.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gpu-check", help="the check to run first on a GPU machine: kernels, FlashInfer, "
                                   "engine, training step, in one table", description=__doc__.splitlines()[0])
    add_args(parser)
    parser.set_defaults(func=run)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=output_dir, default=None, help="also write gpu_check.md and gpu_check.json here")
    parser.add_argument("--budget-s", type=finite_float, default=BUDGET_S,
                        help="no part starts after this many seconds (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    if not 0 < args.budget_s <= MAX_BUDGET_S:  # 0 or less skipped every part, and a check of nothing passed
        raise ConfigError(f"--budget-s must be in (0, {MAX_BUDGET_S:g}], got {args.budget_s:g}")
    cuda = torch.cuda.is_available()
    if not cuda:  # Triton decides at import whether it interprets: before anything below imports it
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from dspark.ops.harness.gpu_check.parts import check_rows
    from dspark.ops.harness.gpu_check.table import failed, render, to_json

    began = time.perf_counter()
    device = torch.device("cuda" if cuda else "cpu")
    with contextlib.redirect_stdout(sys.stderr):  # progress lines go to stderr: stdout carries the table alone
        rows = check_rows(device, TARGET, DRAFTER, deadline=began + args.budget_s)
    heading = f"# gpu-check: {machine(device)}, {time.perf_counter() - began:.0f} s"
    table = render(heading, rows)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.md").write_text(table + "\n")
        (args.out / "gpu_check.json").write_text(json.dumps(to_json(heading, rows), indent=1) + "\n")
    return 1 if failed(rows) else 0


def machine(device: torch.device) -> str:
    versions = ", ".join(f"{name} {installed(name)}" for name in ("torch", "triton", "transformers"))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU dry run ({platform.machine()}, no CUDA device)"
    return f"{where}; python {platform.python_version()}, {versions}"


def installed(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    add_args(parser)
    return run(parser.parse_args(argv))
