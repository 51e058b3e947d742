"""`dspark calibrate`: fit STS temperatures for a DSpark drafter's confidence head.

    dspark calibrate --target DIR --drafter DIR --prompts-file held_out.jsonl --out sts.json --plots out/

Rolls out fixed-length proposals on prompts held out from training, shuffles them into two disjoint halves,
fits the per-position temperatures on the first (left to right, 1-D grid search minimising the ECE of the
cumulative survival; models/decoding/sts.py) and reports ECE before and after on the second. The JSON is what
SGLang 0.5.23 reads with --speculative-dspark-confidence-sts-path, and what `dspark generate/eval --sts` apply.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from dspark.models.decoding.sts import calibrate
from dspark.models.errors import ConfigError
from dspark.models.prompts import encode_chat, load_prompts
from dspark.models.evaluation.plots import plot_reliability
from dspark.models.evaluation.run import EvalSettings, calibration_data, decode_all
from dspark.models.decoding.engine import SpeculativeDecoder
from dspark.models.portable_paths import portable
from dspark.ops.arg_types import finite_float, output_dir, output_file
from dspark.ops.commands.decoding_args import add_model_args, add_sampling_args, load_models, sampling_params


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("calibrate", help="fit STS temperatures for the confidence head",
                                   description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--prompts-file", type=Path, nargs="+", required=True,
                        help='{"turns": [...]} JSONL files held out from training')
    parser.add_argument("--limit", type=int, default=None, help="prompts per file (default: DeepSpec's caps)")
    add_sampling_args(parser, temperature=1.0, max_new_tokens=128)
    parser.add_argument("--fit-fraction", type=finite_float, default=0.5, help="share of prompts used to fit")
    parser.add_argument("--out", type=output_file, required=True, help="STS JSON to write")
    parser.add_argument("--plots", type=output_dir, default=None, help="directory for the reliability diagram")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_params(args)
    if not 0 < args.fit_fraction < 1:
        raise ConfigError(f"--fit-fraction must lie in (0, 1), got {args.fit_fraction}")
    texts = [text for path in args.prompts_file for text in load_prompts(path, args.limit)]
    random.Random(args.seed).shuffle(texts)  # both halves from the same mix of files
    if len(texts) < 2:
        raise ConfigError("calibration needs at least 2 prompts (one to fit, one to test)")
    target, drafter = load_models(args)
    if drafter.config.kind != "dspark" or not drafter.config.enable_confidence_head:
        raise ConfigError(f"{args.drafter} has no confidence head to calibrate (only DSpark drafters do)")
    cut = min(max(1, round(args.fit_fraction * len(texts))), len(texts) - 1)
    settings = EvalSettings(args.max_new_tokens, sampling, args.batch_size, args.seed, baseline=False)
    decoder = SpeculativeDecoder(target.model, drafter)  # fixed length: every position is observed
    halves = []
    for name, part in (("fit", texts[:cut]), ("test", texts[cut:])):
        prompts = [encode_chat(target.tokenizer, text) for text in part]
        generations, _ = decode_all(decoder, prompts, settings, target.eos_token_ids, f"rollouts ({name})")
        halves.append(calibration_data(generations))
    dataset = ",".join(portable(p) for p in args.prompts_file)
    result = calibrate(halves[0], halves[1], dataset)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result.save(args.out)
    print(f"fit on {halves[0].logits.shape[0]} rounds ({cut} prompts), tested on {halves[1].logits.shape[0]} rounds "
          f"({len(texts) - cut} prompts)")
    print("position  temperature  ECE before  ECE after")
    for k, (t, before, after) in enumerate(zip(result.temperatures, result.ece_before, result.ece_after), start=1):
        print(f"{k:>8}  {t:>11.2f}  {before:>10.4f}  {after:>9.4f}")
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    print(f"mean ECE on held-out rollouts: {mean(result.ece_before):.4f} -> {mean(result.ece_after):.4f}")
    print(f"wrote {args.out}")
    if args.plots is not None:
        path = plot_reliability(halves[1], args.plots / "reliability_sts.png", "held-out rollouts: before / after STS",
                                result.tensor())
        print(f"plot: {path}")
    return 0
