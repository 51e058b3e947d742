"""What a speculative round costs, measured online: the overhead the SPS policies add to the table, and the
measured curve that refits the table from live traffic. The engine (engine.py) and the SGLang plugin's planner
(integration/planner.py) plan on the same clock.

A round drafts, verifies `n` tokens (sum of 1 + l_r), accepts and commits; its wall time `s` is one sample
(n, s) of the whole round's cost. The engine times its own drafting rounds (`add`); SGLang's planner sees only
its own calls, so it takes the interval between the starts of two consecutive planned rounds (`planned`, then
`observe` at the next one).

    RoundClock   overhead = the smallest of the last WINDOW (s - 1/SPS(n)): what a round spends beyond the
                 profiled verify forward, the drafting pass above all (on a 2-core CPU a quarter of a
                 SmolLM2 round). Idle gaps and prefill batches between served rounds only ever add time, so
                 the minimum errs towards verifying less (as does a table profiled in a slow moment of a
                 shared machine: its forwards look dearer than they are). causal and lagged plan on
                 `SpsTable.with_overhead(overhead)`: Algorithm 1 weighs an admission's expected token
                 against what it adds to the whole round, not to the verify forward alone, which a fixed
                 drafting cost makes relatively cheaper. It depends on earlier rounds only, so admission
                 stays causal (lossless).
    RoundCosts   the last WINDOW samples again, for two things:
                 error  how far the planner's cost model is from reality: the median over samples of
                        |1/SPS(n) + overhead - s| / s (the `dspark_sps_table_error_ratio` gauge)
                 fit    a table measured from traffic: at each probe of the current table (its floor bins)
                        with at least MIN_PER_BIN samples, steps/s = 1 / median s; at the others the current
                        table's time scaled by the median of s * SPS(n) over all samples. The median shrugs
                        off the gaps and prefills that the minimum above avoids. It times whole rounds, so
                        once installed the overhead measures about zero.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Optional

import torch

from dspark.kernels.sps import SpsTable
from dspark.models.errors import ConfigError

MIN_PER_BIN = 8


class RoundCosts:
    WINDOW = 2048

    def __init__(self):
        self.samples: deque = deque(maxlen=self.WINDOW)  # (verify tokens, seconds)

    def reset(self) -> None:
        self.samples.clear()

    def add(self, tokens: int, seconds: float) -> None:
        self.samples.append((tokens, seconds))

    def table_seconds(self, table: SpsTable) -> list[float]:
        """The table's time for each sample's verify batch."""
        tokens = torch.tensor([n for n, _ in self.samples])
        return (1.0 / table.lookup(tokens)).tolist()

    def error(self, table: SpsTable, overhead: float) -> Optional[float]:
        if not self.samples:
            return None
        predicted = self.table_seconds(table)
        return statistics.median(abs(p + overhead - s) / s for p, (_, s) in zip(predicted, self.samples))

    def fit(self, table: SpsTable, min_samples: int) -> SpsTable:
        """The measured table (module docstring); a ConfigError with fewer than min_samples samples."""
        if len(self.samples) < max(1, min_samples):
            raise ConfigError(f"the live round-cost window holds {len(self.samples)} rounds; the SPS refit needs "
                              f"at least {max(1, min_samples)}: serve more traffic first")
        probes = torch.tensor(table.sample_batch_tokens)
        tokens = torch.tensor([n for n, _ in self.samples])
        bins = (torch.searchsorted(probes, tokens, right=True) - 1).clamp(0, len(probes) - 1).tolist()
        scale = statistics.median(s / p for p, (_, s) in zip(self.table_seconds(table), self.samples))
        seconds = [scale / sps for sps in table.sample_steps_per_sec]
        for index in range(len(seconds)):
            measured = [s for b, (_, s) in zip(bins, self.samples) if b == index]
            if len(measured) >= MIN_PER_BIN:
                seconds[index] = statistics.median(measured)
        return SpsTable(table.sample_batch_tokens, tuple(1.0 / s for s in seconds), table.max_batch_tokens)


class RoundClock:
    WINDOW = 16

    def __init__(self):
        self.costs = RoundCosts()
        self.reset()

    def reset(self) -> None:
        """Forget the overhead samples (they were taken against another table); the costs stay: they do not
        depend on the table."""
        self.samples: deque = deque(maxlen=self.WINDOW)
        self.last: Optional[tuple[float, int]] = None  # (start time, verify tokens) of the previous round

    def add(self, tokens: int, seconds: float, table: SpsTable) -> None:
        """A round that verified `tokens` tokens took `seconds`, drafting included."""
        self.costs.add(tokens, seconds)
        self.samples.append(seconds - 1.0 / float(table.lookup(torch.tensor([tokens]))[0]))

    def observe(self, now: float, table: SpsTable) -> None:
        """At a planned round's start: the previous planned round took until `now`."""
        if self.last is not None:
            then, tokens = self.last
            self.add(tokens, now - then, table)

    def planned(self, now: float, verify_tokens: int) -> None:
        self.last = (now, verify_tokens)

    def overhead(self) -> float:
        return max(0.0, min(self.samples)) if self.samples else 0.0
