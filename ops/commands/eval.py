"""`dspark eval`: tau, acceptance by position, confidence calibration and speed on prompt datasets.

    dspark eval --target DIR --drafter DIR --policy fixed --datasets prompts/gsm8k.jsonl \
        --limit 20 --json out/eval.json --plots out/plots

The DeepSpec protocol (docs/evaluation.md, models/evaluation/): first turns through the chat template,
temperature 1, every draft verified (`--policy fixed`; the settings' default, causal, verifies what pays),
tau pooled over rounds including the bonus token; then the same prompts without speculation for tokens/s.
Works for DSpark, DFlash and Eagle3 drafters (DFlash and Eagle3 have no confidences: --policy fixed or mtp1;
calibration: DSpark only).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.models.prompts import encode_chat, load_prompts
from dspark.models.evaluation.plots import plot_acceptance, plot_reliability
from dspark.models.evaluation.run import DEEPSPEC_SEED, EvalSettings, calibration_data, evaluate
from dspark.models.evaluation.teacher_forced import teacher_forced_acceptance
from dspark.models.errors import ConfigError
from dspark.models.portable_paths import portable
from dspark.ops.arg_types import output_dir, output_file
from dspark.ops.commands.decoding_args import (add_model_args, add_sampling_args, add_verify_args, dtype_name,
                                               load_models, sampling_params, verify_policy)


# eval measures acceptance, so it drafts every round unless told otherwise (--drafting auto: with the gate)
SETTINGS_DEFAULTS = {"drafting": "always"}
SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "batch_size", "limit", "threshold")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="measure tau, acceptance, calibration and speed",
                                   description=__doc__.splitlines()[0])
    add_model_args(parser)
    data = parser.add_argument_group("datasets")
    data.add_argument("--datasets", type=Path, nargs="+", required=True, help='{"turns": [...]} JSONL files')
    data.add_argument("--limit", type=int, default=None, help="prompts per dataset (default: DeepSpec's caps)")
    add_sampling_args(parser, temperature=1.0, max_new_tokens=256)
    parser.set_defaults(seed=DEEPSPEC_SEED)
    add_verify_args(parser, defaults=SETTINGS_DEFAULTS)
    out = parser.add_argument_group("outputs")
    out.add_argument("--no-baseline", action="store_true", help="skip the no-speculation timing run")
    out.add_argument("--teacher-forced", action="store_true",
                     help="also the drafter's teacher-forced greedy acceptance on the target's own greedy replies: "
                          "what the drafter knows of these prompts, apart from the decoding loop")
    out.add_argument("--json", type=output_file, default=None)
    out.add_argument("--plots", type=output_dir, default=None, help="directory for acceptance / reliability PNGs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_params(args)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    datasets = {path.stem: load_prompts(path, args.limit) for path in args.datasets}  # validate before loading
    target, drafter = load_models(args)
    policy, sts = verify_policy(args, drafter, target.model, args.batch_size)
    settings = EvalSettings(args.max_new_tokens, sampling, args.batch_size, args.seed, not args.no_baseline)
    results, generations = {}, []
    for name, texts in datasets.items():
        prompts = [encode_chat(target.tokenizer, text) for text in texts]
        results[name], gens = evaluate(target.model, drafter, prompts, settings, target.eos_token_ids, policy, sts,
                                       desc=name, drafting=args.drafting)
        generations += gens
        if args.teacher_forced:
            results[name]["teacher_forced"] = teacher_forced_acceptance(
                target.model, drafter, prompts, args.max_new_tokens, target.eos_token_ids, args.batch_size).to_json()
        print(result_line(name, results[name]))
    report = {"target": portable(args.target), "drafter": portable(args.drafter), "kind": drafter.config.kind,
              "gamma": drafter.config.gamma, "drafter_dtype": dtype_name(drafter), "drafting": args.drafting,
              "settings": {k: v for k, v in vars(args).items() if k in SETTINGS},
              "datasets": results, "macro_tau": sum(r["tau"] for r in results.values()) / len(results)}
    print(f"macro tau {report['macro_tau']:.3f} over {len(results)} dataset(s)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plots is not None:
        write_plots(args.plots, drafter.config.kind, results, calibration_data(generations), sts)
    return 0



def result_line(name: str, result: dict) -> str:
    line = (f"{name}: tau {result['tau']:.3f} over {result['rounds']} rounds; acceptance by position "
            + " ".join(f"{a:.2f}" for a in result["conditional_acceptance"]))
    if "teacher_forced" in result:
        forced = result["teacher_forced"]
        line += (f"; teacher-forced on the target's greedy replies: tau {forced['tau']:.3f}, acceptance "
                 + " ".join(f"{a:.2f}" for a in forced["conditional"]))
    if "calibration" in result:
        line += f"; ECE {result['calibration']['ece_mean']:.4f}"
    if "speedup" in result:
        line += (f"; {result['tokens_per_s']:.1f} tok/s vs {result['baseline_tokens_per_s']:.1f} without "
                 f"speculation ({result['speedup']:.2f}x)")
    return line


def write_plots(directory: Path, kind: str, results: dict, calibration, sts) -> None:
    paths = [plot_acceptance(results, directory / "acceptance_by_position.png", f"{kind}: acceptance by position")]
    if calibration is not None:
        paths.append(plot_reliability(calibration, directory / "reliability.png", f"{kind}: confidence calibration",
                                      sts))
    print("plots: " + ", ".join(str(p) for p in paths))
