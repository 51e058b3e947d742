"""The SPS cost table: target forward steps per second as a function of the verify batch size in tokens.

The allocator (kernels/allocate.py) trades expected accepted tokens against this curve: verifying B tokens per
forward runs at SPS(B) forwards per second, so the expected goodput of a plan is tau * SPS(B).

Schema and lookup are SGLang 0.5.23's `SpsCostTable` (sglang.srt.speculative.dspark_components.dspark_sps), so
one JSON file serves both our engine and `--speculative-dspark-sps-table-path`:

    {"sample_batch_tokens": [1, 2, 4, ...],        strictly increasing probe sizes
     "sample_steps_per_sec": [41.2, 40.8, ...],    measured forwards per second at each probe
     "max_batch_tokens": 512}                      the largest batch the engine may send (>= the last probe)

lookup(B) is the value of the largest probe <= B (a step function), clamped to the first and last probes.
SPS values need not decrease: real curves are jagged (paper §5.2).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch



@dataclass(frozen=True)
class SpsTable:
    sample_batch_tokens: tuple[int, ...]
    sample_steps_per_sec: tuple[float, ...]
    max_batch_tokens: int

    def __post_init__(self) -> None:
        tokens, sps = self.sample_batch_tokens, self.sample_steps_per_sec
        if not tokens:
            raise ValueError("SPS table is empty: it needs at least one (batch tokens, steps/s) probe")
        if len(tokens) != len(sps):
            raise ValueError(f"SPS table has {len(tokens)} sample_batch_tokens but {len(sps)} sample_steps_per_sec")
        if any(t < 1 for t in tokens) or any(b <= a for a, b in zip(tokens, tokens[1:])):
            raise ValueError(f"SPS table sample_batch_tokens must be positive and strictly increasing, got {list(tokens)}")
        if not all(math.isfinite(s) and s > 0 for s in sps):
            raise ValueError(f"SPS table sample_steps_per_sec must be finite and > 0, got {list(sps)}")
        if self.max_batch_tokens < tokens[-1]:
            raise ValueError(f"SPS table max_batch_tokens {self.max_batch_tokens} is below its largest probe {tokens[-1]}")

    @classmethod
    def from_probes(cls, probes: dict[int, float], max_batch_tokens: int | None = None) -> SpsTable:
        tokens = tuple(sorted(probes))
        return cls(tokens, tuple(float(probes[t]) for t in tokens),
                   max_batch_tokens if max_batch_tokens is not None else (tokens[-1] if tokens else 0))

    def lookup(self, batch_tokens: torch.Tensor) -> torch.Tensor:
        """SPS at each batch size: [...] long -> [...] float64 (the floor-probe rule of the module docstring)."""
        probes = torch.tensor(self.sample_batch_tokens, device=batch_tokens.device)
        index = (torch.searchsorted(probes, batch_tokens, right=True) - 1).clamp(0, len(probes) - 1)
        return torch.tensor(self.sample_steps_per_sec, dtype=torch.float64, device=batch_tokens.device)[index]

    def with_overhead(self, seconds: float) -> SpsTable:
        """The table of a step that also spends `seconds` outside the verify forward (drafting, scheduling):
        SPS'(B) = 1 / (1 / SPS(B) + seconds). The ordering of plans by tau * SPS stays that of whole steps."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"step overhead must be finite and >= 0 seconds, got {seconds}")
        return SpsTable(self.sample_batch_tokens, tuple(1.0 / (1.0 / s + seconds) for s in self.sample_steps_per_sec),
                        self.max_batch_tokens)

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def to_text(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_text())
