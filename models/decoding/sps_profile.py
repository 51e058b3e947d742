"""Measure the target's SPS curve on this machine: verify forwards per second against the batch size in tokens.

A probe of B tokens is a verify forward shaped as the engine sends it: R = max(1, round(B / tokens_per_request))
requests (SGLang's profiler also sweeps requests x draft tokens), each with `context_len` committed tokens in the
KV cache and B tokens spread over them, through the engine's own TargetRunner (ragged mask, holes). The new slots
are dropped after each forward, so every repeat sees the same cache.

Every probe is set up first; then `warmup` untimed and `repeats` timed passes each run every probe once, smallest
first. Interleaved, a slow moment of a shared machine (a server profiling itself at start may share the CPU with
anything) lands on several sizes once each instead of on every repeat of one size.

Timing noise only ever slows a forward down, so each probe's fastest time is an upper bound on its true cost;
and a bigger verify batch never costs less than a smaller one, so every probe at B' >= B bounds the cost at B
too. The table keeps the tightest bound, seconds(B) = min over probes B' >= B of their fastest time. (The
envelope from the other side, SPS(B) = min over B' <= B, passed one slow probe on to every size above it.)
SmolLM2 on 2 shared cores, four startup profiles of 1-7 tokens, 3 repeats each: the table's 3-token time was
45/45/45/53 ms this way, 50/47/86/52 ms one size at a time with that envelope, whose 86 ms then stood for every
size up to 7 (an 81 ms one, in a run with the demo's settings, kept its planner at one draft in 422 of 424
rounds). The result is an SpsTable (kernels/sps.py), the schema SGLang reads, plus the raw timings for the plot;
`load_sps` reads one back, turning every failure into a ConfigError that never quotes the file (which
paths a live update may name: sps_paths.py).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from dspark.kernels.sps import SpsTable
from dspark.models.errors import SHOWN_CHARS, ConfigError, clipped
from dspark.models.jsonl import read_json_file

MAX_TABLE_BYTES = 1 << 20  # a real table is a few hundred bytes
KIND = "an SpsCostTable JSON"
DEFAULT_BATCH_TOKENS = (1, 2, 4, 7, 8, 14, 16, 28, 32, 48, 64, 96, 128, 192, 256)
MAX_PROBE_CACHED_TOKENS = 1 << 20  # the defaults cache ~15K; every probe's cache is set up before the timed passes


def probe_sizes(largest: int, tokens_per_request: int) -> list[int]:
    """Every size up to one full block (tokens_per_request: a single request's verify rounds, whose costs on a CPU
    are not monotone in between), then powers of two up to `largest`, and `largest` itself."""
    return sorted({1 << i for i in range(largest.bit_length()) if 1 << i <= largest}
                  | set(range(1, min(tokens_per_request, largest) + 1)) | {largest})


def probe_shape(batch_tokens: int, tokens_per_request: int) -> torch.Tensor:
    """New tokens per request for one probe: [R] long summing to batch_tokens, as even as possible."""
    requests = max(1, round(batch_tokens / tokens_per_request))
    counts = torch.full((requests,), batch_tokens // requests, dtype=torch.long)
    counts[: batch_tokens % requests] += 1
    return counts


class Probe:
    """One verify-shaped forward, set up once: `counts` [R] new tokens per request over `context_len` cached ones."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module, counts: torch.Tensor, context_len: int, generator: torch.Generator):
        # imported here: the runner loads transformers, which reading a table (load_sps: the admin sidecar, the
        # live state) does not need
        from dspark.models.decoding.target import TargetRunner

        self.runner = TargetRunner(model, len(counts))
        vocab, device = model.config.vocab_size, self.runner.device
        context = torch.randint(vocab, (len(counts), context_len), generator=generator).to(device)
        self.runner.forward(context, torch.ones_like(context, dtype=torch.bool), last_logits_only=True)
        self.runner.commit(torch.ones_like(context, dtype=torch.bool))
        width = int(counts.max())
        self.tokens = torch.randint(vocab, (len(counts), width), generator=generator).to(device)
        self.new_valid = (torch.arange(width) < counts[:, None]).to(device)

    @torch.no_grad()
    def seconds(self) -> float:
        """Time one forward, then drop its slots: the next call sees the same cache."""
        synchronize(self.runner.device)
        start = time.perf_counter()
        self.runner.forward(self.tokens, self.new_valid)
        synchronize(self.runner.device)
        elapsed = time.perf_counter() - start
        self.runner.commit(torch.zeros_like(self.new_valid))
        return elapsed


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_probe_plan(batch_tokens: Sequence[int], *, tokens_per_request: int, warmup: int, repeats: int,
                     context_len: int = 1) -> None:
    """Refuse a profile that cannot run, or whose probes' caches (all set up at once: `context_len` tokens per
    request) would hold over MAX_PROBE_CACHED_TOKENS, before any model loads."""
    if not batch_tokens or min(batch_tokens) < 1 or len(set(batch_tokens)) != len(batch_tokens):
        raise ConfigError(f"--batch-tokens must be distinct positive sizes, got {list(batch_tokens)[:20]}")
    if tokens_per_request < 1 or warmup < 0 or repeats < 1 or context_len < 1:
        raise ConfigError(f"need tokens_per_request >= 1, warmup >= 0, repeats >= 1, context_len >= 1; got "
                          f"{tokens_per_request}, {warmup}, {repeats}, {context_len}")
    cached = sum(len(probe_shape(b, tokens_per_request)) for b in batch_tokens) * context_len
    if cached > MAX_PROBE_CACHED_TOKENS:
        raise ConfigError(f"the probes would cache {cached} tokens (requests x --context-len), over "
                          f"{MAX_PROBE_CACHED_TOKENS}: fewer or smaller --batch-tokens, or a shorter --context-len")


def profile_sps(model: torch.nn.Module, batch_tokens: Sequence[int] = DEFAULT_BATCH_TOKENS, *,
                tokens_per_request: int = 7, context_len: int = 128, warmup: int = 2, repeats: int = 5,
                seed: int = 0, progress: bool = True) -> tuple[SpsTable, list[dict]]:
    """(the SPS table, one record per probe: batch_tokens, requests, median/min/max seconds)."""
    check_probe_plan(batch_tokens, tokens_per_request=tokens_per_request, warmup=warmup, repeats=repeats,
                     context_len=context_len)
    generator = torch.Generator().manual_seed(seed)
    return measure_table(lambda counts: Probe(model, counts, context_len, generator).seconds, batch_tokens,
                         tokens_per_request=tokens_per_request, warmup=warmup, repeats=repeats, progress=progress)


def measure_table(probe: Callable[[torch.Tensor], Callable[[], float]], batch_tokens: Sequence[int], *,
                  tokens_per_request: int, warmup: int, repeats: int,
                  progress: bool = True) -> tuple[SpsTable, list[dict]]:
    """The SPS table from timed verify-shaped forwards, whatever runs them (the engine's TargetRunner here,
    SGLang's model runner in the server: integration/sps_forward.py). `probe(counts)` sets up one forward of
    `counts` [R] new tokens per request and returns what times it once (seconds); every probe is set up first,
    then the passes run interleaved (module docstring)."""
    check_probe_plan(batch_tokens, tokens_per_request=tokens_per_request, warmup=warmup, repeats=repeats)
    sizes = sorted(batch_tokens)
    counts = [probe_shape(b, tokens_per_request) for b in sizes]
    probes = [probe(c) for c in counts]
    timings = [[] for _ in sizes]
    for repeat in tqdm(range(warmup + repeats), desc="profiling SPS", unit="pass", disable=not progress):
        for seconds, seen in zip(probes, timings):
            elapsed = seconds()
            if repeat >= warmup:
                seen.append(elapsed)
    records = [{"batch_tokens": b, "requests": len(c), "median_s": statistics.median(t), "min_s": min(t),
                "max_s": max(t)} for b, c, t in zip(sizes, counts, timings)]
    fastest = [r["min_s"] for r in records]
    table = SpsTable.from_probes({b: 1.0 / min(fastest[i:]) for i, b in enumerate(sizes)})  # min over B' >= B
    return table, records


def load_sps(path: Path | str) -> SpsTable:
    """Read an SPS table JSON (SGLang's SpsCostTable schema). Every failure to read or parse it (an unreadable or
    overlong path, a directory, a file over MAX_TABLE_BYTES, bytes that are not UTF-8 JSON, missing fields, values
    the table's rules refuse) is a ConfigError that names the path and the kind of failure but never the file's
    contents or the parser's positions: a live update's refusal is served back to its caller."""
    where = f"SPS table {clipped(str(path), SHOWN_CHARS)}"
    data = read_json_file(path, where, KIND, MAX_TABLE_BYTES, how_to_make="write one with `dspark profile-sps`")
    try:
        fields = data["sample_batch_tokens"], data["sample_steps_per_sec"], data["max_batch_tokens"]
        return SpsTable(tuple(int(t) for t in fields[0]), tuple(float(s) for s in fields[1]), int(fields[2]))
    except Exception as err:  # KeyError, TypeError, the table's ValueError, ...
        raise ConfigError(f"{where} is not {KIND} ({type(err).__name__}): UTF-8 JSON with "
                          f"sample_batch_tokens (positive, strictly increasing), as many sample_steps_per_sec "
                          f"(finite, > 0) and max_batch_tokens (>= the largest size)") from None
