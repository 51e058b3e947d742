"""`dspark bench`: tau per dataset for several drafters of one target, and tokens/s against no speculation.

    dspark bench --target DIR --drafters dspark=embedded/dspark dflash=embedded/dflash eagle3=embedded/eagle3 \
        --datasets math=gsm8k.jsonl code=humaneval.jsonl chat=mt-bench.jsonl --out bench/results/embedded

Two phases, both on the reference engine (models/decoding):
1. tau: every drafter on the first --prompts prompts of every dataset (DeepSpec's shuffle), temperature 1,
   every draft verified, --max-new-tokens each; tau pooled over rounds, and its macro average over datasets.
   Requests decode --tau-batch-size at a time: each request's acceptance does not depend on its batch
   (only the random stream does), and batching makes this phase several times faster on a slow target.
2. speed: --speed-prompts prompts (taken round-robin from the datasets) decoded greedily at each batch size,
   by the target alone and with each drafter verifying every draft; drafters with a confidence head run again
   as "<kind>+causal", verification lengths from the causal allocator (Algorithm 1) on the SPS curve profiled
   at start. Greedy makes every run emit the same tokens, so tokens/s compare like for like; the output is
   checked to equal the target's own. The speculative speed runs use --drafting (auto: the drafting gate skips
   the drafter while plain decoding is faster). Each decoder is warmed up untimed; then the decoders take turns
   batch by batch, in a rotating order, --speed-repeats times over. tokens/s is the median repeat's, and every
   ratio is to the "none" run of the same batch size and invocation: the median of the repeats' paired ratios,
   printed with their range (models/evaluation/paired.py), because a shared VM's speed drifts by 5-30% within
   minutes, as much as the differences measured. "none-again" is the target alone a second time, in the same
   turns: its ratio to "none" is how far this run's noise alone moves a ratio.
Every run records its accepted-length histogram (rounds by drafts accepted, models/evaluation/acceptance.py).
Writes <out>/bench.json, bench.md (the tables) and plots: tau by dataset, acceptance by position, tokens/s,
accepted lengths.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dspark.kernels.warping import GREEDY, SamplingParams  # noqa: E402
from dspark.models.decoding.cpu_linears import linear_plans  # noqa: E402
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder  # noqa: E402
from dspark.models.decoding.loading import load_drafter_for, load_target  # noqa: E402
from dspark.models.decoding.verify_length import VerifyLengthPolicy  # noqa: E402
from dspark.models.errors import ConfigError  # noqa: E402
from dspark.models.evaluation.acceptance import acceptance_summary  # noqa: E402
from dspark.models.prompts import encode_chat, load_prompts  # noqa: E402
from dspark.models.evaluation.paired import format_ratio, paired_ratio, timed_in_turns  # noqa: E402
from dspark.models.evaluation.plots import plot_accepted_lengths, plot_acceptance, save  # noqa: E402
from dspark.models.evaluation.run import EvalSettings, evaluate, warm_up  # noqa: E402
from dspark.ops.arg_types import BATCH, MAX_NEW_TOKENS, SEED, output_dir  # noqa: E402
from dspark.ops.commands.threads import add_threads_arg, use_threads  # noqa: E402
from dspark.ops.commands.decoding_args import (add_drafter_dtype_arg, add_drafting_arg,  # noqa: E402
                                              add_cpu_linears_arg, add_draft_vocab_arg, draft_vocab_size,
                                              dtype_name, startup_sps)

NO_SPEC_RUNS = ("none", "none-again")  # the target alone, and once more as the run's noise floor


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="tau and tokens/s of several drafters against no speculation",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--name", default=None, help="label of the target in the tables (default: its folder)")
    parser.add_argument("--drafters", nargs="+", required=True, metavar="KIND=DIR")
    parser.add_argument("--datasets", nargs="+", required=True, metavar="NAME=JSONL")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per dataset for tau")
    parser.add_argument("--max-new-tokens", type=MAX_NEW_TOKENS, default=128)
    parser.add_argument("--tau-batch-size", type=int, default=1, help="requests decoded together for tau")
    parser.add_argument("--speed-prompts", type=int, default=8)
    parser.add_argument("--speed-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=BATCH, nargs="+", default=[1, 8])
    parser.add_argument("--speed-repeats", type=int, default=3, help="timed runs per decoder (median reported)")
    add_drafting_arg(parser)  # the speed runs; tau is measured drafting every round
    add_drafter_dtype_arg(parser)
    add_cpu_linears_arg(parser)
    add_draft_vocab_arg(parser)
    parser.add_argument("--seed", type=SEED, default=0)
    add_threads_arg(parser)
    parser.add_argument("--out", type=output_dir, required=True)
    parser.set_defaults(func=run)


def pairs(values: list, flag: str) -> dict:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"{flag} takes NAME=PATH pairs, got {value!r}")
        out[name] = Path(path)
    return out


def run(args: argparse.Namespace) -> int:
    for name in ("prompts", "tau_batch_size", "speed_prompts", "speed_tokens", "speed_repeats"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    drafter_paths = pairs(args.drafters, "--drafters")
    datasets = {name: load_prompts(path, args.prompts) for name, path in pairs(args.datasets, "--datasets").items()}
    round_robin = len(datasets) * min(len(texts) for texts in datasets.values())  # what the speed runs draw from
    if round_robin < args.speed_prompts:
        raise ConfigError(f"--speed-prompts {args.speed_prompts} asks for more prompts than the datasets hold taken "
                          f"round-robin ({round_robin}: as many from each as the shortest has, at most --prompts "
                          f"{args.prompts}): raise --prompts or lower --speed-prompts")
    use_threads(args)
    target = load_target(args.target, cpu_linears=args.cpu_linears)
    drafters = {kind: load_drafter_for(path, target, args.drafter_dtype, args.cpu_linears, args.draft_vocab)
                for kind, path in drafter_paths.items()}
    encoded = {name: [encode_chat(target.tokenizer, t) for t in texts] for name, texts in datasets.items()}
    report = {"target": args.name or args.target.name, "settings": {
        "prompts_per_dataset": args.prompts, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
        "tau_batch_size": args.tau_batch_size,
        "speed_prompts": args.speed_prompts, "speed_tokens": args.speed_tokens, "batch_sizes": args.batch_sizes,
        "speed_repeats": args.speed_repeats,
        "drafting": args.drafting, "drafter_dtype": dtype_name(next(iter(drafters.values()))),
        "draft_vocab_sizes": {kind: draft_vocab_size(d) for kind, d in drafters.items()},
        "cpu_linears": {"target": linear_plans(target.model), **{k: linear_plans(d) for k, d in drafters.items()}},
        "threads": args.threads},
        "tau": tau_phase(target, drafters, encoded, args), "speed": None}
    report["speed"] = speed_phase(target, drafters, encoded, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "bench.md").write_text(tables(report))
    write_plots(report, args.out)
    print(tables(report))
    print(f"wrote {args.out}/bench.json, bench.md and plots")
    return 0


def tau_phase(target, drafters: dict, encoded: dict, args) -> dict:
    settings = EvalSettings(args.max_new_tokens, SamplingParams(1.0), args.tau_batch_size, args.seed, baseline=False)
    results = {}
    for kind, drafter in drafters.items():
        per_dataset = {}
        for name, prompts in encoded.items():
            result, _ = evaluate(target.model, drafter, prompts, settings, target.eos_token_ids, desc=f"{kind}/{name}")
            per_dataset[name] = {k: result[k] for k in ("tau", "rounds", "generated_tokens", "conditional_acceptance",
                                                        "cumulative_acceptance", "accepted_drafts",
                                                        "accepted_histogram")}
            print(f"{kind} {name}: tau {result['tau']:.3f}")
        macro = sum(r["tau"] for r in per_dataset.values()) / len(per_dataset)
        results[kind] = {"gamma": drafter.config.gamma, "datasets": per_dataset, "macro_tau": macro}
    return results


def speed_phase(target, drafters: dict, encoded: dict, args) -> dict:
    mixed = [p for group in zip(*encoded.values()) for p in group][: args.speed_prompts]
    aware = {k: d for k, d in drafters.items() if d.config.enable_confidence_head}
    block = max((d.config.gamma + 1 for d in aware.values()), default=1)
    sps = startup_sps(target.model, block, max(args.batch_sizes)) if aware else None
    results = {}
    for batch_size in args.batch_sizes:
        config = GenerationConfig(args.speed_tokens, GREEDY, target.eos_token_ids)
        runs = {kind: SpeculativeDecoder(target.model) for kind in NO_SPEC_RUNS}
        runs |= {k: SpeculativeDecoder(target.model, d, drafting=args.drafting) for k, d in drafters.items()}
        runs |= {f"{k}+causal": SpeculativeDecoder(target.model, d, VerifyLengthPolicy.of("causal", sps=sps),
                                                   drafting=args.drafting) for k, d in aware.items()}
        warm_up(list(runs.values()), mixed[:batch_size], config, args.seed)
        walls, outputs, identical = timed_in_turns(runs, mixed, batch_size, config, args.speed_repeats,
                                                     args.seed, f"speed bs{batch_size}")
        row = {}
        for kind, decoder in runs.items():
            gamma = decoder.drafter.config.gamma if decoder.drafter is not None else 0
            summary = acceptance_summary(outputs[kind], gamma)  # the last repeat's rounds
            tokens = sum(len(g.token_ids) for g in outputs[kind])
            row[kind] = {"tokens_per_s": tokens / statistics.median(walls[kind]), "walls_s": walls[kind],
                         "tokens_per_s_runs": [tokens / wall for wall in walls[kind]],
                         "identical_to_target": identical[kind],
                         **{k: summary[k] for k in ("tau", "rounds", "accepted_drafts", "accepted_histogram")}}
        for kind in runs:
            speedup, paired = paired_ratio(row[kind]["tokens_per_s_runs"], row["none"]["tokens_per_s_runs"])
            row[kind] |= {"speedup": speedup, "speedup_runs": paired}
        results[str(batch_size)] = row
    return results


def tables(report: dict) -> str:
    tau, speed = report["tau"], report["speed"]
    names = list(next(iter(tau.values()))["datasets"])
    lines = [f"### {report['target']}: tau (T=1, every draft verified)", "",
             "| drafter | " + " | ".join(names) + " | macro |", "|---" * (len(names) + 2) + "|"]
    for kind, result in tau.items():
        cells = [f"{result['datasets'][n]['tau']:.3f}" for n in names]
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | **{result['macro_tau']:.3f}** |")
    runs = [k for k in next(iter(speed.values())) if k != "none"]
    drafting = report["settings"]["drafting"]
    lines += ["", f"### {report['target']}: greedy tokens/s, ratio to none (no speculation, measured in the same "
              f"run at the same batch size: the median of the repeats' paired ratios, their range in brackets; "
              f"none-again is the target alone once more; speculative runs drafting {drafting})", "",
              "| batch | none | " + " | ".join(runs) + " |", "|---" * (len(runs) + 2) + "|"]
    for batch_size, row in speed.items():
        cells = [f"{row['none']['tokens_per_s']:.1f}"]
        cells += [f"{row[k]['tokens_per_s']:.1f}, {format_ratio(row[k]['speedup'], row[k]['speedup_runs'])}"
                  for k in runs]
        lines.append(f"| {batch_size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_plots(report: dict, out: Path) -> None:
    tau = report["tau"]
    names = list(next(iter(tau.values()))["datasets"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(tau)
    # one colour per drafter, in both panels
    colors = {"none": "gray", "none-again": "silver"} | {kind: f"C{i}" for i, kind in enumerate(tau)}
    for i, (kind, result) in enumerate(tau.items()):
        xs = [j + i * width for j in range(len(names) + 1)]
        axes[0].bar(xs, [result["datasets"][n]["tau"] for n in names] + [result["macro_tau"]], width, label=kind,
                    color=colors[kind])
    axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(names) + 1)], names + ["macro"])
    axes[0].set_ylabel("tau (tokens per target forward)")
    axes[0].set_title("accepted length")
    tallest = max(d["tau"] for r in tau.values() for d in r["datasets"].values())  # the macro bar is a mean
    axes[0].set_ylim(0, 1.35 * tallest)  # headroom above the bars for the legend
    axes[0].legend(ncol=3, fontsize=8, loc="upper center")
    batch_sizes = list(report["speed"])
    for kind in report["speed"][batch_sizes[0]]:
        base = kind.split("+")[0]
        axes[1].plot(batch_sizes, [report["speed"][b][kind]["tokens_per_s"] for b in batch_sizes], marker="o",
                     label=kind, color=colors[base], ls="--" if "+" in kind else "-")
    axes[1].set_xlabel("batch size")
    axes[1].set_ylabel("tokens/s (greedy, wall clock)")
    axes[1].set_title("throughput")
    axes[1].legend()
    fig.suptitle(f"{report['target']}")
    save(fig, out / "tau_and_throughput.png")
    pooled = {kind: {"tau": r["macro_tau"], **{key: mean_curve([d[key] for d in r["datasets"].values()])
                                                for key in ("conditional_acceptance", "cumulative_acceptance")}}
              for kind, r in tau.items()}
    plot_acceptance(pooled, out / "acceptance_by_position.png", f"{report['target']}: acceptance by position "
                    "(mean over datasets)")
    plot_accepted_lengths(accepted_length_panels(report), out / "accepted_lengths.png",
                          f"{report['target']}: accepted length per verify round")


def accepted_length_panels(report: dict) -> dict:
    """The tau phase pooled over datasets, and the speed runs at the first batch size (none and none-again left
    out: they never draft, so their histograms are all at 0 accepted)."""
    tau = {kind: [sum(column) for column in zip(*(d["accepted_histogram"] for d in r["datasets"].values()))]
           for kind, r in report["tau"].items()}
    first = next(iter(report["speed"]))
    speed = {kind: r["accepted_histogram"] for kind, r in report["speed"][first].items() if kind not in NO_SPEC_RUNS}
    drafting = report["settings"]["drafting"]
    return {"tau phase (T=1, every draft verified)": tau, f"speed, batch {first} (greedy, drafting {drafting})": speed}


def mean_curve(curves: list) -> list:
    return [sum(values) / len(values) for values in zip(*curves)]
