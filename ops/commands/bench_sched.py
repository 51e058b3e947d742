"""`dspark bench-sched`: goodput, verify budget, tau and per-user speed of every allocation policy under load.

    dspark bench-sched --target embedded/target --drafter embedded/dspark --prompts-file humaneval.jsonl \
        --concurrency 1 2 4 8 16 32 64 --simulate-to 1024 --out bench/results/sched

1. SPS: --sps-table, or profile the target now (written to <out>/sps.json and sps.png).
2. Measured: continuous batching in the reference engine at each concurrency for each policy
   (models/evaluation/scheduling.py): mtp1, fixed-2, fixed-3, fixed (every draft), threshold, causal
   (Algorithm 1), lagged (§5.2).
3. Simulated: the same policies from concurrency 1 to --simulate-to on the measured SPS curve, the fitted rest
   of the round cost and the recorded acceptance traces (models/evaluation/simulate.py); labelled simulation everywhere.
Writes <out>/sched.json, sched.md and plots (goodput and verify budget against concurrency, like the paper's
Fig. 8), and prints the table with the checks of the allocator issue.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding.engine import GenerationConfig
from dspark.models.decoding.settings import CONFIDENCE_POLICIES
from dspark.models.decoding.sps_profile import load_sps, probe_sizes, profile_sps
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError
from dspark.models.evaluation.datasets import encode_chat, load_prompts
from dspark.models.evaluation.plots import plot_load, plot_sps
from dspark.models.evaluation.scheduling import LoadSettings, measure_load
from dspark.models.evaluation.simulate import SIMULATION, extend_sps, fit_cost, simulate
from dspark.ops.commands.decoding_args import add_model_args, load_models


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench-sched", help="allocation policies under load: measured and simulated",
                                   description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--prompts-file", type=Path, required=True, help='{"turns": [...]} JSONL prompt set')
    parser.add_argument("--limit", type=int, default=32, help="distinct prompts (cycled to fill each run)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--simulate-to", type=int, default=1024, help="largest simulated concurrency (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold", type=float, default=0.3, help="the threshold policy's survival threshold")
    parser.add_argument("--sps-table", type=Path, default=None, help="SPS JSON (default: profile the target now)")
    parser.add_argument("--out", type=Path, required=True)
    parser.set_defaults(func=run)


def policies(sps, gamma: int, threshold: float) -> dict:
    chosen = {"mtp1": VerifyLengthPolicy.of("mtp1")}
    chosen.update({f"fixed-{k}": VerifyLengthPolicy.of("fixed", max_verify_length=k) for k in (2, 3) if k < gamma})
    chosen["fixed"] = VerifyLengthPolicy.of("fixed")
    chosen["threshold"] = VerifyLengthPolicy.of("threshold", threshold=threshold)
    chosen["causal"] = VerifyLengthPolicy.of("causal", sps=sps)
    chosen["lagged"] = VerifyLengthPolicy.of("lagged", sps=sps)
    return chosen


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    if args.simulate_to < 0:
        raise ConfigError(f"--simulate-to must be >= 0, got {args.simulate_to}")
    target, drafter = load_models(args)
    if not drafter.config.enable_confidence_head:
        raise ConfigError(f"{args.drafter} has no confidence head: the confidence-aware policies need a DSpark drafter")
    gamma = drafter.config.gamma
    prompts = [encode_chat(target.tokenizer, text) for text in load_prompts(args.prompts_file, args.limit)]
    settings = LoadSettings(tuple(sorted(set(args.concurrency))),
                            config=GenerationConfig(args.max_new_tokens, sampling, target.eos_token_ids),
                            seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    sps = load_sps(args.sps_table) if args.sps_table is not None else profiled_sps(target.model, settings, gamma, args.out)
    chosen = policies(sps, gamma, args.threshold)
    measured, traces = measure_load(target.model, drafter, prompts, chosen, settings)
    if args.simulate_to and traces is None:
        print("no measured round verified all gamma drafts, so there are no acceptance traces: simulation skipped "
              "(raise --max-new-tokens)")
    simulated = simulate_all(measured, traces, chosen, sps, gamma, args.simulate_to, args.seed)
    report = {"target": str(args.target), "drafter": str(args.drafter), "gamma": gamma,
              "sampling": vars(sampling), "max_new_tokens": args.max_new_tokens, "threads": args.threads,
              "sps_table": sps.to_json(), "simulated": simulated,
              "measured": [{k: v for k, v in row.items() if k != "rounds"} for row in measured],
              "checks": checks(measured)}
    (args.out / "sched.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(measured, simulated)
    (args.out / "sched.md").write_text(table)
    print(table)
    for line in report["checks"]["lines"]:
        print(line)
    path = plot_load(measured, simulated, args.out / "load.png",
                     f"{args.target.name} + {args.drafter.name}, {args.threads} CPU thread(s)")
    print(f"wrote {args.out / 'sched.json'}, sched.md; plots: {path}, {args.out / 'sps.png'}")
    return 0


def profiled_sps(model: torch.nn.Module, settings: LoadSettings, gamma: int, out: Path):
    """Profile the SPS curve up to the largest batch the measured runs can send."""
    sizes = probe_sizes(max(settings.concurrency) * (gamma + 1), gamma + 1)
    table, records = profile_sps(model, sizes, tokens_per_request=gamma + 1)
    table.save(out / "sps.json")
    plot_sps(records, out / "sps.png", "verify cost of the target (measured)")
    return table


def simulate_all(measured: list, traces, chosen: dict, sps, gamma: int, simulate_to: int, seed: int) -> list:
    if not simulate_to or traces is None:
        return []
    levels = [1 << i for i in range(simulate_to.bit_length()) if 1 << i <= simulate_to]
    cost = replace(fit_cost(measured, sps), sps=extend_sps(sps, simulate_to * (gamma + 1)))
    rows = []
    for name, policy in chosen.items():
        for c in levels:
            rows.append({"policy": name, **simulate(cost, traces, policy, c, seed=seed)})
    return rows


def checks(measured: list) -> dict:
    """The allocator issue's targets, computed from the measured rows."""
    by = {(r["policy"], r["concurrency"]): r["goodput_tok_s"] for r in measured}
    levels = sorted({c for _, c in by})
    aware = [p for p in CONFIDENCE_POLICIES if (p, levels[-1]) in by]
    fixed = [p for p, _ in by if p.startswith("fixed") or p == "mtp1"]
    top, low = levels[-1], levels[0]
    best_aware = max(aware, key=lambda p: by[(p, top)])
    best_fixed_low = max(by[(p, low)] for p in set(fixed))
    best_aware_low = max(by[(p, low)] for p in aware)
    never_below_mtp1 = all(max(by[(p, c)] for p in aware) >= by[("mtp1", c)] for c in levels)
    lines = [
        f"at concurrency {top}: best confidence-aware ({best_aware}) {by[(best_aware, top)]:.1f} tok/s = "
        f"{by[(best_aware, top)] / by[('fixed', top)]:.2f}x fixed ({by[('fixed', top)]:.1f}); target >= 1.2x",
        f"best confidence-aware never below mtp1 at any concurrency: {never_below_mtp1}",
        f"at concurrency {low}: best confidence-aware {best_aware_low:.1f} tok/s = "
        f"{best_aware_low / best_fixed_low:.3f}x the best fixed policy ({best_fixed_low:.1f}); target >= 0.95x",
    ]
    return {"best_aware_at_top": best_aware, "ratio_vs_fixed_at_top": by[(best_aware, top)] / by[("fixed", top)],
            "never_below_mtp1": never_below_mtp1, "ratio_vs_best_fixed_at_low": best_aware_low / best_fixed_low,
            "lines": lines}


def markdown(measured: list, simulated: list) -> str:
    head = ("| policy | concurrency | goodput tok/s | verify budget / request | tau | per-request tok/s | source |\n"
            "|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['policy']} | {r['concurrency']} | {r['goodput_tok_s']:.1f} | {r['verify_budget']:.2f} | "
        f"{r['tau']:.2f} | {r['request_tok_s']:.1f} | {r.get('source', 'measured')} |\n"
        for r in measured + [s for s in simulated if s["concurrency"] > max(m["concurrency"] for m in measured)])
    return head + body + f"\nRows marked {SIMULATION} come from the simulator, not from running the engine.\n"
