"""`dspark profile-sps`: measure the target's verify cost curve and write the SPS table the allocator uses.

    dspark profile-sps --target DIR --out sps.json [--batch-tokens 1 2 4 ...] [--device cuda]

Writes the table in SGLang 0.5.23's SpsCostTable schema (kernels/sps.py), so the same file feeds
`dspark generate/eval --policy causal|lagged --sps-table` and SGLang's --speculative-dspark-sps-table-path,
and a plot of steps/s and tokens/s against the batch size next to it (.png).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dspark.models.decoding.loading import load_target
from dspark.models.decoding.sps_profile import DEFAULT_BATCH_TOKENS, check_probe_plan, profile_sps
from dspark.models.evaluation.plots import plot_sps
from dspark.ops.arg_types import int_in, output_file, torch_device
from dspark.ops.commands.decoding_args import add_cpu_linears_arg
from dspark.ops.commands.threads import add_threads_arg, use_threads


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("profile-sps", help="measure target forwards/s per verify batch size",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True, help="transformers model directory of the target")
    parser.add_argument("--out", type=output_file, required=True,
                        help="SPS table JSON to write (plot: same name, .png)")
    parser.add_argument("--batch-tokens", type=int_in(1, 1 << 16), nargs="+", default=list(DEFAULT_BATCH_TOKENS),
                        help="probe sizes: tokens per verify forward")
    parser.add_argument("--tokens-per-request", type=int_in(1, 1024), default=7,
                        help="gamma + 1: how probes split into requests")
    parser.add_argument("--context-len", type=int_in(1, 1 << 20), default=128, help="cached tokens per request")
    parser.add_argument("--warmup", type=int_in(0, 1000), default=2)
    parser.add_argument("--repeats", type=int_in(1, 1000), default=5)
    parser.add_argument("--device", type=torch_device, default="cpu", help="cpu or cuda")
    add_cpu_linears_arg(parser)
    add_threads_arg(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_probe_plan(args.batch_tokens, tokens_per_request=args.tokens_per_request, warmup=args.warmup,
                     repeats=args.repeats, context_len=args.context_len)  # before the weights load
    use_threads(args)
    target = load_target(args.target, args.device, cpu_linears=args.cpu_linears)
    table, records = profile_sps(target.model, args.batch_tokens, tokens_per_request=args.tokens_per_request,
                                 context_len=args.context_len, warmup=args.warmup, repeats=args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.save(args.out)
    print("batch tokens  requests  ms/forward  steps/s  tokens/s")
    for r in records:
        print(f"{r['batch_tokens']:>12}  {r['requests']:>8}  {r['median_s'] * 1e3:>10.1f}  "
              f"{1 / r['median_s']:>7.2f}  {r['batch_tokens'] / r['median_s']:>8.1f}")
    plot = plot_sps(records, args.out.with_suffix(".png"), f"{args.target.name}: verify cost on {args.device}")
    print(f"wrote {args.out} and {plot}")
    return 0
