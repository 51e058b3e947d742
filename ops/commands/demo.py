"""`dspark demo`: answer a few chat prompts with DSpark on CPU and show the speedup over the target alone.

    dspark demo --target ~/.cache/dspark/targets/smollm2-135m-instruct --drafter embedded/smollm2-dspark-regen

Each prompt is answered twice, greedily: by the target alone and with speculative decoding, whose verification
lengths come from the causal allocator (paper Algorithm 1) on this machine's SPS curve, profiled at start
(--policy and --sps-table change that). Greedy decoding
makes both answers identical token for token (the demo checks it), so the wall-clock ratio is the speedup.
Prints each answer, tau and tokens/s; writes demo.json (with the accepted-length histogram: verify rounds by
drafts accepted), the acceptance-by-position and the accepted-length plots to --out. It also prints what this
machine's costs allow (models/evaluation/speedup_bound.py): the speedup the run's acceptance by position is expected
to give, and the acceptance a drafter needs to break even and to run 1.5x and 2x as fast (speedup_bound.png).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from dspark.kernels.warping import GREEDY
from dspark.models.decoding.cpu_linears import linear_plans
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.evaluation.acceptance import acceptance_summary
from dspark.models.prompts import encode_chat, load_prompts
from dspark.models.evaluation.plots import plot_accepted_lengths, plot_acceptance, plot_speedup_bound
from dspark.models.evaluation.run import warm_up
from dspark.models.evaluation.speedup_bound import MIN_REACHED, ChainCosts, speedup_curve, speedup_report
from dspark.models.portable_paths import portable
from dspark.ops.arg_types import MAX_NEW_TOKENS, output_dir
from dspark.ops.commands.decoding_args import (add_model_args, add_verify_args, draft_vocab_size, dtype_name, load_models,
                                              startup_sps, verify_policy)

DEMO_PROMPTS = (
    "A bakery sells muffins for $3 each and cookies for $1.50 each. Sam buys 4 muffins and 6 cookies. "
    "How much does he spend?",
    "Write a Python function that returns the factorial of n.",
    "What are three tips for staying focused while studying?",
    "Explain what a hash table is in two sentences.",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="answer chat prompts with DSpark and show the speedup",
                                   description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--prompts-file", type=Path, default=None, help="JSONL of {\"turns\": [...]} (default: 4 built-in)")
    parser.add_argument("--max-new-tokens", type=MAX_NEW_TOKENS, default=96)
    parser.add_argument("--out", type=output_dir, default=Path("out/demo"))
    add_verify_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    texts = list(DEMO_PROMPTS) if args.prompts_file is None else load_prompts(args.prompts_file)
    target, drafter = load_models(args)
    config = GenerationConfig(args.max_new_tokens, GREEDY, target.eos_token_ids)
    policy, sts = verify_policy(args, drafter, target.model)
    decoders = {"target alone": SpeculativeDecoder(target.model),
                "speculative": SpeculativeDecoder(target.model, drafter, policy, sts, args.drafting)}
    walls = {name: 0.0 for name in decoders}
    records, generations = [], []
    traces = {name: [] for name in decoders}
    prompts = [encode_chat(target.tokenizer, text) for text in texts]
    warm_up(list(decoders.values()), prompts[:1], config)
    for index, (text, prompt) in enumerate(zip(texts, prompts)):
        outputs = {}
        order = list(decoders) if index % 2 == 0 else list(reversed(decoders))  # neither path always runs first
        for name in order:
            decoder = decoders[name]
            begin = time.perf_counter()
            outputs[name] = decoder.generate([prompt], config, trace=traces[name])[0]
            walls[name] += time.perf_counter() - begin
        spec, alone = outputs["speculative"], outputs["target alone"]
        generations.append(spec)
        tau = acceptance_summary([spec], drafter.config.gamma)["tau"]
        print(f"\n>>> {text}\n{target.tokenizer.decode(spec.token_ids, skip_special_tokens=True).strip()}")
        print(f"    [{len(spec.token_ids)} tokens, tau {tau:.2f}, identical to the target alone: "
              f"{spec.token_ids == alone.token_ids}]")
        records.append({"prompt": text, "token_ids": spec.token_ids, "tau": tau,
                        "identical_to_target": spec.token_ids == alone.token_ids})
    tokens = sum(len(g.token_ids) for g in generations)
    summary = acceptance_summary(generations, drafter.config.gamma)
    speed = {name: tokens / wall for name, wall in walls.items()}
    speedup = speed["speculative"] / speed["target alone"]
    print(f"\n{drafter.config.kind} ({policy.name} verification lengths): tau {summary['tau']:.2f} tokens per "
          "target forward; "
          f"{speed['speculative']:.1f} tok/s vs {speed['target alone']:.1f} tok/s for the target alone: "
          f"{speedup:.2f}x faster on {torch.get_num_threads()} CPU thread(s)")
    args.out.mkdir(parents=True, exist_ok=True)
    limits = speedup_limits(target.model, policy, drafter.config.gamma, summary, traces, speedup, args)
    (args.out / "demo.json").write_text(json.dumps({
        "target": portable(args.target), "drafter": portable(args.drafter), "policy": policy.name, "drafting": args.drafting,
        "drafter_dtype": dtype_name(drafter), "draft_vocab_size": draft_vocab_size(drafter),
        "cpu_linears": {"target": linear_plans(target.model), "drafter": linear_plans(drafter)},
        "tokens_per_s": speed,
        "speedup": speedup,
        "acceptance": summary, "speedup_bound": limits, "answers": records}, indent=1) + "\n")
    plot = plot_acceptance({drafter.config.kind: summary}, args.out / "acceptance_by_position.png",
                           f"{drafter.config.kind} on {args.target.name}: acceptance by position")
    panels = {f"drafting {args.drafting}": {drafter.config.kind: summary["accepted_histogram"]}}
    lengths = plot_accepted_lengths(panels, args.out / "accepted_lengths.png",
                                    f"{drafter.config.kind} on {args.target.name}: accepted length per verify round")
    bound = f", {args.out / 'speedup_bound.png'}" if limits is not None else ""
    print(f"plots: {plot}, {lengths}{bound}; details: {args.out / 'demo.json'}")
    differing = [r["prompt"] for r in records if not r["identical_to_target"]]
    if differing:
        print(f"error: {len(differing)} answer(s) differ from the target alone's: {differing}", file=sys.stderr)
        return 1
    return 0


def speedup_limits(target_model, policy, gamma: int, summary: dict, traces: dict, speedup: float,
                   args: argparse.Namespace) -> dict | None:
    """What this machine's costs allow (speedup_bound.py): printed, plotted, and returned for demo.json. The costs
    are the run's medians: the target alone's round, and the drafting pass of the speculative path's drafting
    rounds; None when none drafted."""
    drafting = [r.draft_s for r in traces["speculative"] if r.drafted]
    if not drafting:
        return None
    plain = statistics.median(r.draft_s + r.verify_s for r in traces["target alone"])
    costs = ChainCosts(policy.sps or startup_sps(target_model, gamma + 1, 1), plain, statistics.median(drafting))
    report = speedup_report(summary["conditional_acceptance"], summary["reached_by_position"], costs, gamma)
    needed = ", ".join(f"{label} {alpha:.2f}" if alpha is not None else f"{label} out of reach"
                       for label, alpha in report["acceptance_needed"].items())
    measured = ", ".join(f"{a:.2f}" for a in report["measured_acceptance"])
    expected = (f"{report['expected_speedup']:.2f}x verifying the best fixed number of drafts every round "
                f"({report['best_verify_len']})" if report["measured_acceptance"]
                else f"nothing yet: fewer than {MIN_REACHED} rounds verified a draft")
    print(f"on this machine a plain round takes {costs.plain_s * 1e3:.1f} ms and drafting "
          f"{costs.draft_s * 1e3:.1f} ms: this run's acceptance by position ({measured}) is expected to give "
          f"{expected}; the acceptance needed at every position: {needed}")
    first = report["measured_acceptance"][:1]
    plot_speedup_bound(speedup_curve(costs, gamma), report, (first[0], speedup) if first else None,
                       args.out / "speedup_bound.png", f"{args.drafter.name} on {args.target.name}: "
                       f"{costs.plain_s * 1e3:.1f} ms a plain round, {costs.draft_s * 1e3:.1f} ms drafting")
    return report
