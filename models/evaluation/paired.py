"""Ratios between runs that took turns on a shared machine: the one definition `bench` and `bench-sched` report.

A shared VM's speed drifts by 5-30% within minutes, as much as the differences a benchmark measures. Runs that
take turns (every decoder once, then every decoder again, ...) meet the same drift within one turn, so the ratio
of a run to the baseline's run of the same turn cancels most of it, and the median of those paired ratios drops
the turn that a burst of load hit on one side only. Their range is printed beside it: the noise the run had.
`timed_in_turns` runs decoders that way (`bench`, `gpu-check`).
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
from tqdm import tqdm

from dspark.models.decoding.engine import GenerationConfig


def paired_ratio(runs: Sequence[float], baseline: Sequence[float]) -> tuple:
    """(the median of runs[i] / baseline[i], every one of those ratios); the runs are rates (higher is faster)."""
    paired = [a / b for a, b in zip(runs, baseline, strict=True)]
    return statistics.median(paired), paired


def format_ratio(ratio: float, paired: Sequence[float]) -> str:
    """'1.07x', and with several paired ratios their range: '1.07x (0.98-1.12)'."""
    return f"{ratio:.2f}x" + (f" ({min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else "")


def timed_in_turns(runs: dict, prompts: list, batch_size: int, config: GenerationConfig, repeats: int, seed: int,
                   desc: str) -> tuple:
    """Every decoder decodes every batch of `prompts`, `repeats` times. The decoders take turns batch by
    batch, and the order rotates, so a drift in the machine's speed (a shared VM's varies by +-5% within
    minutes) falls on all of them alike. -> ({kind: [wall seconds per repeat]}, {kind: the last repeat's
    generations}, {kind: whether every repeat's tokens equal the "none" run's})"""
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    kinds = list(runs)
    walls = {kind: [0.0] * repeats for kind in kinds}
    outputs = {kind: [[] for _ in batches] for kind in kinds}
    identical = {kind: True for kind in kinds}
    turns = [(repeat, b) for repeat in range(repeats) for b in range(len(batches))]
    for turn, (repeat, b) in enumerate(tqdm(turns, desc=desc, unit="batch", leave=False)):
        for kind in kinds[turn % len(kinds):] + kinds[: turn % len(kinds)]:
            generator = torch.Generator().manual_seed(seed + b * batch_size)
            begin = time.perf_counter()
            outputs[kind][b] = runs[kind].generate(batches[b], config, generator)
            walls[kind][repeat] += time.perf_counter() - begin
        for kind in kinds:
            identical[kind] &= [g.token_ids for g in outputs[kind][b]] == [g.token_ids for g in outputs["none"][b]]
    return walls, {kind: [g for batch in outputs[kind] for g in batch] for kind in kinds}, identical
