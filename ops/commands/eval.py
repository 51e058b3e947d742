"""`dspark eval`: tau, acceptance by position, confidence calibration and speed on prompt datasets.

    dspark eval --target DIR --drafter DIR --policy fixed --datasets prompts/gsm8k.jsonl \
        --limit 20 --json out/eval.json --plots out/plots

The DeepSpec protocol (docs/evaluation.md, models/evaluation/): first turns through the chat template,
temperature 1, every draft verified (`--policy fixed`; the settings' default, causal, verifies what pays),
tau pooled over rounds including the bonus token; then the same prompts without speculation for tokens/s.
Works for DSpark, DFlash and Eagle3 drafters (DFlash and Eagle3 have no confidences: --policy fixed or mtp1;
calibration: DSpark only).

A candidate against the serving drafter (docs/traffic-loop.md), e.g. a fine-tune on captured traffic, on the
prompts its training held out:
    dspark eval --target DIR --drafter SERVING --candidate runs/candidate --datasets runs/candidate/held_out.jsonl \
        --temperature 0 --policy fixed --json out/compare.json
Both decode the same prompts with the same settings and seeds; the report has each one's tau and acceptance by
position and, greedy, whether every answer is the same (verification is lossless, so it must be: exit status 1
names the prompts where it is not).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dspark.models.decoding.loading import load_drafter_for
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
    parser.add_argument("--candidate", type=Path, default=None, metavar="DIR",
                        help="a second drafter decoded on the same prompts and settings, compared with --drafter: "
                             "tau and acceptance by position of both and, at --temperature 0, identical answers")
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
    if args.candidate is not None and not args.candidate.is_dir():
        raise ConfigError(f"--candidate {args.candidate} is not a drafter directory")
    target, drafter = load_models(args)
    candidate = (load_drafter_for(args.candidate, target, args.drafter_dtype, args.cpu_linears, args.draft_vocab)
                 if args.candidate is not None else None)
    prompts = {name: [encode_chat(target.tokenizer, text) for text in texts] for name, texts in datasets.items()}
    report, answers, sts = drafter_report(args, target, args.drafter, drafter, prompts, sampling, not args.no_baseline)
    if args.plots is not None:
        write_plots(args.plots, drafter.config.kind, report["datasets"],
                    calibration_data([g for gens in answers.values() for g in gens]), sts)
    status = 0
    if candidate is not None:  # the same prompts, settings and seeds; its speed is not the question here
        report["candidate"], candidate_answers, _ = drafter_report(args, target, args.candidate, candidate, prompts,
                                                                   sampling, baseline=False, label="candidate ")
        report["comparison"] = comparison(report, report["candidate"], answers, candidate_answers,
                                          greedy=sampling.greedy)
        for name, compared in report["comparison"]["datasets"].items():
            print(comparison_line(name, compared))
        differing = {name: c["differing_prompts"] for name, c in report["comparison"]["datasets"].items()
                     if c["differing_prompts"]}
        if differing:
            print(f"greedy answers differ between the drafters (lossless verification must give the same): "
                  f"{differing}", file=sys.stderr)
            status = 1
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return status


def drafter_report(args: argparse.Namespace, target, path: Path, drafter, prompts: dict, sampling, baseline: bool,
                   label: str = "") -> tuple[dict, dict, object]:
    """(the report of one drafter over every dataset, its generations by dataset, its STS temperatures), its lines
    printed."""
    policy, sts = verify_policy(args, drafter, target.model, args.batch_size)
    settings = EvalSettings(args.max_new_tokens, sampling, args.batch_size, args.seed, baseline)
    results, answers = {}, {}
    for name, encoded in prompts.items():
        results[name], answers[name] = evaluate(target.model, drafter, encoded, settings, target.eos_token_ids,
                                                policy, sts, desc=label + name, drafting=args.drafting)
        if args.teacher_forced:
            results[name]["teacher_forced"] = teacher_forced_acceptance(
                target.model, drafter, encoded, args.max_new_tokens, target.eos_token_ids, args.batch_size).to_json()
        print(label + result_line(name, results[name]))
    report = {"target": portable(args.target), "drafter": portable(path), "kind": drafter.config.kind,
              "gamma": drafter.config.gamma, "drafter_dtype": dtype_name(drafter), "drafting": args.drafting,
              "settings": {k: v for k, v in vars(args).items() if k in SETTINGS},
              "datasets": results, "macro_tau": sum(r["tau"] for r in results.values()) / len(results)}
    print(f"{label}macro tau {report['macro_tau']:.3f} over {len(results)} dataset(s)")
    return report, answers, sts


def comparison(serving: dict, candidate: dict, serving_answers: dict, candidate_answers: dict, greedy: bool) -> dict:
    """Per dataset: both drafters' tau and acceptance by position, and (greedy only: sampled answers differ by
    chance) the indices of the prompts whose answers are not token for token the same."""
    datasets = {}
    for name, ours in serving["datasets"].items():
        theirs = candidate["datasets"][name]
        pairs = zip(serving_answers[name], candidate_answers[name])
        datasets[name] = {
            "tau": {"serving": ours["tau"], "candidate": theirs["tau"]},
            "tau_gain": theirs["tau"] / ours["tau"] - 1,
            "conditional_acceptance": {"serving": ours["conditional_acceptance"],
                                       "candidate": theirs["conditional_acceptance"]},
            "prompts": ours["prompts"],
            "differing_prompts": [i for i, (a, b) in enumerate(pairs) if a.token_ids != b.token_ids] if greedy else [],
            "answers_compared": greedy,
        }
    return {"datasets": datasets, "macro_tau": {"serving": serving["macro_tau"], "candidate": candidate["macro_tau"]},
            "candidate_better": candidate["macro_tau"] > serving["macro_tau"]}


def comparison_line(name: str, compared: dict) -> str:
    tau, acceptance = compared["tau"], compared["conditional_acceptance"]
    answers = (f"answers identical {compared['prompts'] - len(compared['differing_prompts'])}/{compared['prompts']}"
               if compared["answers_compared"] else "answers not compared (sampled: --temperature 0 compares them)")
    return (f"{name}: candidate tau {tau['candidate']:.3f} against serving {tau['serving']:.3f} "
            f"({compared['tau_gain']:+.1%}); acceptance by position "
            + " ".join(f"{a:.2f}" for a in acceptance["candidate"]) + " against "
            + " ".join(f"{a:.2f}" for a in acceptance["serving"]) + f"; {answers}")


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
