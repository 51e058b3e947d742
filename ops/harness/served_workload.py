"""The workload of the served benchmarks (bench-serve, bench-trace): its flags, and every prompt answered greedily
through a running SGLang server at a given concurrency."""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dspark.integration.server import SGLangServer
from dspark.ops.arg_types import MAX_NEW_TOKENS, int_in


def add_workload_args(parser: argparse.ArgumentParser, limit: int, max_new_tokens: int) -> None:
    """The models and prompts of a served benchmark (bench-serve, bench-trace)."""
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--prompts-file", type=Path, required=True, help='JSONL of {"turns": [...]} rows')
    parser.add_argument("--limit", type=int_in(1, 100_000), default=limit, help="prompts used")
    parser.add_argument("--max-new-tokens", type=MAX_NEW_TOKENS, default=max_new_tokens)


def answer_all(server: SGLangServer, prompts: list[list[int]], max_new_tokens: int, concurrency: int) -> dict:
    """Every prompt answered greedily, `concurrency` requests in flight; outputs and timings."""
    def one(ids):
        begin = time.perf_counter()
        response = server.post("/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0}}, timeout_s=600)
        return response, time.perf_counter() - begin

    begin = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - begin
    tokens = sum(r["meta_info"]["completion_tokens"] for r, _ in results)
    forwards = sum(r["meta_info"].get("spec_verify_ct") or r["meta_info"]["completion_tokens"] for r, _ in results)
    return {"concurrency": concurrency, "outputs": [r["output_ids"] for r, _ in results], "tokens": tokens,
            "wall_s": wall, "goodput_tok_s": tokens / wall, "tau": tokens / max(forwards, 1),
            "verify_forwards": forwards,
            "request_tok_s": sum(r["meta_info"]["completion_tokens"] / s for r, s in results) / len(results)}
