"""Ratios between runs that took turns on a shared machine: the one definition `bench` and `bench-sched` report.

A shared VM's speed drifts by 5-30% within minutes, as much as the differences a benchmark measures. Runs that
take turns (every decoder once, then every decoder again, ...) meet the same drift within one turn, so the ratio
of a run to the baseline's run of the same turn cancels most of it, and the median of those paired ratios drops
the turn that a burst of load hit on one side only. Their range is printed beside it: the noise the run had.
"""
from __future__ import annotations

import statistics
from typing import Sequence


def paired_ratio(runs: Sequence[float], baseline: Sequence[float]) -> tuple:
    """(the median of runs[i] / baseline[i], every one of those ratios); the runs are rates (higher is faster)."""
    paired = [a / b for a, b in zip(runs, baseline, strict=True)]
    return statistics.median(paired), paired


def format_ratio(ratio: float, paired: Sequence[float]) -> str:
    """'1.07x', and with several paired ratios their range: '1.07x (0.98-1.12)'."""
    return f"{ratio:.2f}x" + (f" ({min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else "")
