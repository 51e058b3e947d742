"""`dspark generate`: answer prompts with speculative decoding (or the target alone) and show what happened.

    dspark generate --target embedded/target --drafter embedded/dspark --prompt "def fib(n):" --temperature 0
    dspark generate --target DIR --no-spec --prompts-file prompts.jsonl --num-samples 4 --json out.json

Prompts go through the target's chat template (prompts files: `{"turns": [...]}` JSONL, first turn). The text
of every sample is printed; --json also records per sample the token ids, the rounds (drafts verified, accepted,
tokens committed) and the wall time of the batch it was decoded in.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.prompts import encode_chat, load_prompts
from dspark.ops.arg_types import int_in, output_file
from dspark.ops.commands.decoding_args import (add_model_args, add_sampling_args, add_verify_args, load_models,
                                               sampling_params, verify_policy)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate text with speculative decoding",
                                   description=__doc__.splitlines()[0])
    add_model_args(parser, drafter_required=False)
    prompts = parser.add_argument_group("prompts").add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt", help="one user prompt")
    prompts.add_argument("--prompts-file", type=Path, help='JSONL of {"turns": [...]} rows')
    add_sampling_args(parser, temperature=0.0, max_new_tokens=128)
    parser.add_argument("--num-samples", type=int_in(1, 10_000), default=1, help="samples per prompt")
    add_verify_args(parser)
    parser.add_argument("--json", type=output_file, default=None, help="write every sample's details here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_params(args)
    texts = [args.prompt] if args.prompt is not None else load_prompts(args.prompts_file, limit=None)
    target, drafter = load_models(args)
    policy, sts = verify_policy(args, drafter, target.model, args.batch_size)
    requests = [(i, s, encode_chat(target.tokenizer, text)) for i, text in enumerate(texts)
                for s in range(args.num_samples)]
    decoder = SpeculativeDecoder(target.model, drafter, policy, sts, args.drafting)
    config = GenerationConfig(args.max_new_tokens, sampling, target.eos_token_ids)
    samples = []
    for start in range(0, len(requests), args.batch_size):
        batch = requests[start:start + args.batch_size]
        generator = torch.Generator().manual_seed(args.seed + start)
        begin = time.perf_counter()
        outputs = decoder.generate([ids for _, _, ids in batch], config, generator)
        wall = time.perf_counter() - begin
        for (prompt_index, sample_index, _), out in zip(batch, outputs):
            text = target.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            print(f"--- prompt {prompt_index} sample {sample_index} ({out.finish_reason}, {len(out.token_ids)} tokens)")
            print(text)
            samples.append(sample_record(prompt_index, sample_index, texts[prompt_index], text, out, wall))
    summarize(samples, drafter is not None)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": settings(args), "samples": samples}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def sample_record(prompt_index, sample_index, prompt, text, out, batch_wall_s) -> dict:
    return {
        "prompt_index": prompt_index, "sample_index": sample_index, "prompt": prompt, "text": text,
        "token_ids": out.token_ids, "finish_reason": out.finish_reason, "target_forwards": out.target_forwards,
        "rounds": [{"verify_len": r.verify_len, "accepted": r.accepted, "emitted": r.emitted} for r in out.rounds],
        "accepted_length_per_round": [r.emitted for r in out.rounds],
        "batch_wall_s": round(batch_wall_s, 4),
    }


def summarize(samples: list, speculative: bool) -> None:
    tokens = sum(len(s["token_ids"]) for s in samples)
    rounds = sum(len(s["rounds"]) for s in samples)
    line = f"{len(samples)} samples, {tokens} tokens"
    if speculative and rounds:
        line += f", tau {sum(sum(s['accepted_length_per_round']) for s in samples) / rounds:.2f} tokens per round"
    print(line)


def settings(args: argparse.Namespace) -> dict:
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
            if key not in ("func", "_parser")}
