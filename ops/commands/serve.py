"""`dspark serve`: serve a target with its DSpark drafter through SGLang, dspark's plugin loaded.

    dspark serve --target embedded/target --drafter embedded/dspark          # CPU: the CPU recipe
    dspark serve --target DIR --drafter DIR --policy lagged --port 30000 -- --tp-size 2

Starts `python -m sglang.launch_server` with SGLang's own `--speculative-algorithm DSPARK`, the ragged
verify layout and dspark's allocator as the verify planner (the plugin loads itself through SGLang's
`sglang.srt.plugins` entry point). The drafter is checked against the target before SGLang starts; without
--sps-table the plugin profiles one at engine start and reuses it from the cache on later starts. The
runtime-state flags set the initial state; change it live with
`curl -X POST HOST/set_internal_state -d '{"server_args": {"dspark": {"policy": "threshold", "threshold": 0.4}}}'`
and read it back under `internal_states[0].dspark` of `/get_server_info`. Arguments after `--` go to
SGLang unchanged. --dry-run prints the command and environment instead of starting it.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import torch

from dspark.integration.runtime_state import SGLANG_POLICY, SPS_POLICIES, RuntimeState, compile_state
from dspark.integration.server import (CPU_ENV, CPU_MAX_TOTAL_TOKENS, cpu_server_args, dspark_args, dspark_env, launch_command,
                                       server_environment)
from dspark.kernels.allocate import POLICIES, THRESHOLD_ON
from dspark.models.cache import cache_root
from dspark.models.checkpoint import read_drafter_config
from dspark.models.training.run import load_target_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve the target with DSpark through SGLang (+ dspark's plugin)",
                                   description=__doc__.splitlines()[0])
    models = parser.add_argument_group("models")
    models.add_argument("--target", type=Path, required=True, help="transformers model directory of the target")
    drafter = models.add_mutually_exclusive_group(required=True)
    drafter.add_argument("--drafter", type=Path, help="DSpark drafter checkpoint directory")
    drafter.add_argument("--no-spec", action="store_true", help="serve the target alone (baseline)")
    models.add_argument("--sts", type=Path, default=None,
                        help="STS calibration JSON from `dspark calibrate` (SGLang applies it at load)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=30000)
    server.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when a GPU is visible, else cpu with the CPU recipe (float32, no CUDA "
                             "graphs, no overlap scheduling, small KV pool)")
    server.add_argument("--max-total-tokens", type=int, default=None,
                        help=f"KV pool size in tokens (CPU default {CPU_MAX_TOTAL_TOKENS}; GPU: SGLang's choice)")
    server.add_argument("--max-running-requests", type=int, default=None, help="concurrent requests in a batch")
    server.add_argument("--dry-run", action="store_true", help="print the SGLang command and environment; start nothing")
    state = parser.add_argument_group("runtime state (initial values; live-tunable through /set_internal_state)")
    state.add_argument("--policy", choices=POLICIES + (SGLANG_POLICY,), default="causal",
                       help="verify-length policy: causal (paper Algorithm 1), lagged (paper 5.2), threshold, fixed, "
                            "mtp1, or sglang (SGLang's built-in planner)")
    state.add_argument("--threshold", type=float, default=None, help="threshold policy: survival/confidence cut-off")
    state.add_argument("--threshold-on", choices=THRESHOLD_ON, default="survival")
    state.add_argument("--min-verify-length", type=int, default=0, help="drafts every request verifies at least")
    state.add_argument("--max-verify-length", type=int, default=None, help="drafts any request verifies at most")
    state.add_argument("--budget-fraction", type=float, default=None,
                       help="cap the drafts verified per round at this fraction of requests x gamma")
    state.add_argument("--sps-table", type=Path, default=None,
                       help="SPS table (`dspark profile-sps`); default: profiled at engine start and cached")
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER, help="-- then arguments passed to SGLang as they are")
    parser.set_defaults(func=run)


def runtime_state(args: argparse.Namespace) -> RuntimeState:
    return RuntimeState(policy=args.policy, threshold=args.threshold, threshold_on=args.threshold_on,
                        min_verify_length=args.min_verify_length, max_verify_length=args.max_verify_length,
                        budget_fraction=args.budget_fraction,
                        sps_table=str(args.sps_table.resolve()) if args.sps_table else None)


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], bool]:
    """(the SGLang command, the environment it adds, whether it runs the CPU recipe); checks every input first."""
    target_config, _ = load_target_config(args.target)
    cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    extra = cpu_server_args(args.max_total_tokens or CPU_MAX_TOTAL_TOKENS) if cpu else (
        ["--max-total-tokens", str(args.max_total_tokens)] if args.max_total_tokens else [])
    if args.max_running_requests is not None:
        extra += ["--max-running-requests", str(args.max_running_requests)]
    env = {}
    if args.drafter is not None:
        drafter = read_drafter_config(args.drafter, target_config)
        state = runtime_state(args)
        # Checked whole now; without a table, causal/lagged get the one the plugin profiles at engine start.
        compile_state(state if state.sps_table or state.policy not in SPS_POLICIES else replace(state, policy="fixed"),
                      drafter.gamma)
        extra += dspark_args(args.drafter, cpu=cpu, sps_table=args.sps_table, sts=args.sts)
        env = dspark_env(state.to_dict())
    passthrough = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
    return launch_command(args.target, args.host, args.port, extra + passthrough), env, cpu


def run(args: argparse.Namespace) -> int:
    command, env, cpu = server_command(args)
    added = {**env, **(CPU_ENV if cpu else {})}
    print(" ".join(f"{k}={shlex.quote(v)}" for k, v in added.items()), shlex.join(command))
    if args.dry_run:
        return 0
    # A neutral working directory: `python -m` puts it on sys.path, and a checkout's bare kernels/ would shadow
    # the `kernels` package SGLang depends on (all paths are absolute by now).
    neutral = cache_root() / "serve"
    neutral.mkdir(parents=True, exist_ok=True)
    return subprocess.call(command, env=server_environment(cpu, env), cwd=neutral)
