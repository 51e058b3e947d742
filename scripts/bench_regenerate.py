"""Reply tokens per second: `dspark regenerate` through SGLang's offline Engine against dspark train's own
transformers generation loop (models/training/data.py), on the same chat prompts of a target, same sampling.

    python scripts/bench_regenerate.py --target embedded/target --prompts 64 --max-new-tokens 64 \
        --out bench/results/regenerate/embedded-cpu.json

Each side runs once, the transformers loop first; tokens/s counts the reply tokens each wrote over its generation
time (the Engine's start-up, reported apart, is paid once per run however long the run).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoTokenizer

from dspark.integration.reply_backends import OfflineEngine
from dspark.models.portable_paths import portable
from dspark.models.target_io import load_frozen_target
from dspark.models.training.data import DataConfig, build_dataset
from dspark.models.training.regenerate import ReplySampling, regenerate


def prompts(count: int) -> list[str]:
    """Openings of Python functions: what the embedded code target continues (any target answers them)."""
    verbs = ("read", "parse", "write", "merge", "split", "check", "format", "load")
    nouns = ("config", "header", "table", "record", "path", "token", "buffer", "entry")
    return [f"def {verbs[i % 8]}_{nouns[(i // 8) % 8]}_{i}(" for i in range(count)]


def transformers_loop(target_dir: Path, texts: list[str], sampling: ReplySampling, threads: int) -> dict:
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    documents = [torch.tensor(tokenizer.apply_chat_template([{"role": "user", "content": t}],
                                                            add_generation_prompt=True, return_dict=True)
                              ["input_ids"]) for t in texts]
    cfg = DataConfig(source="chat", num_samples=len(texts), prompt_len=max(len(d) for d in documents),
                     response_len=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                     top_k=sampling.top_k)
    target = load_frozen_target(target_dir, torch.device("cpu"))
    start = time.monotonic()
    dataset = build_dataset(documents, cfg, target, tokenizer.eos_token_id, progress=False)
    wall = time.monotonic() - start
    tokens = int(dataset.loss_mask.sum())
    return {"reply_tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "batch_size": cfg.generation_batch_size, "dtype": "float32", "threads": threads}


def engine(target_dir: Path, texts: list[str], sampling: ReplySampling, concurrency: int, out: Path) -> dict:
    """As `dspark regenerate` runs it: the Engine started inside the event loop that then drives its requests."""
    conversations = [[{"role": "user", "content": t}] for t in texts]
    out.unlink(missing_ok=True)

    timing = {}

    def open_engine() -> OfflineEngine:
        start = time.monotonic()
        backend = OfflineEngine(target_dir, cpu=True)
        timing["started"] = time.monotonic() - start
        return backend

    summary = asyncio.run(regenerate(conversations, open_engine, out, sampling, concurrency, progress=False))
    started = timing["started"]
    return {"reply_tokens": summary.reply_tokens, "wall_s": round(summary.wall_s, 2),
            "tokens_per_s": round(summary.tokens_per_s, 1), "engine_start_s": round(started, 1),
            "concurrency": concurrency, "dtype": "float32"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    texts, sampling = prompts(args.prompts), ReplySampling(max_new_tokens=args.max_new_tokens)
    loop = transformers_loop(args.target, texts, sampling, args.threads)
    sglang = engine(args.target, texts, sampling, args.concurrency, args.out.with_suffix(".replies.jsonl"))
    result = {"target": portable(args.target), "prompts": args.prompts, "sampling": asdict(sampling),
              "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
              "transformers_loop": loop, "sglang_engine": sglang,
              "engine_over_transformers": round(sglang["tokens_per_s"] / loop["tokens_per_s"], 2),
              "command": " ".join(["python", *(portable(a) if Path(a).exists() else a for a in sys.argv)])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".replies.jsonl").unlink(missing_ok=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
