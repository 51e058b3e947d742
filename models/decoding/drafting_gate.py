"""Whether a round drafts at all: speculation must never be slower than the target alone.

A speculative round of the batch costs the drafting pass plus a verify forward over sum(1 + k) tokens and
commits tau tokens per request; a plain round (no drafter call, only the anchor verified) costs one decode
forward and commits exactly one. The gate measures both online, as the engine runs them, and drafts only while

    tau_spec / seconds_spec  >=  1 / seconds_plain          (tokens per request per second)

Every estimate is an exponential moving average (weight SMOOTHING on the newest round) of the rounds measured at
the current batch size (costs depend on it; a new size starts fresh). Until both sides are measured the gate
explores: speculative rounds first, then one plain round. Whichever side loses is re-measured every
REPROBE_EVERY rounds, so a drafter that starts paying (easier text, a smaller batch) is picked up again.

Skipping drafting changes how many tokens a round commits, never which: a plain round verifies the anchor alone,
which is ordinary decoding from the target (greedy identity and the sampled distribution hold either way).

    always   draft every round (DeepSpec's protocol; acceptance measurements, `dspark eval`)
    auto     the gate above (generation, the demo, speed benchmarks)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dspark.models.errors import ConfigError

DRAFTING_MODES = ("auto", "always")
DEFAULT_DRAFTING = "auto"
SMOOTHING = 0.3
REPROBE_EVERY = 16


@dataclass
class Measured:
    """EWMA of one kind of round at one batch size."""
    seconds: Optional[float] = None
    tokens_per_request: Optional[float] = None

    def add(self, seconds: float, tokens_per_request: float) -> None:
        if self.seconds is None:
            self.seconds, self.tokens_per_request = seconds, tokens_per_request
            return
        self.seconds += SMOOTHING * (seconds - self.seconds)
        self.tokens_per_request += SMOOTHING * (tokens_per_request - self.tokens_per_request)

    def rate(self) -> float:
        return self.tokens_per_request / self.seconds if self.seconds else float("inf")


@dataclass
class DraftingGate:
    mode: str = DEFAULT_DRAFTING
    batch_size: int = 0
    spec: Measured = field(default_factory=Measured)
    plain: Measured = field(default_factory=Measured)
    since_probe: int = 0  # rounds since the losing side was last measured

    def __post_init__(self) -> None:
        if self.mode not in DRAFTING_MODES:
            raise ConfigError(f"drafting must be one of {'|'.join(DRAFTING_MODES)}, got {self.mode!r}")

    def drafts(self, batch_size: int) -> bool:
        """Whether the next round, of `batch_size` requests, drafts."""
        if self.mode == "always":
            return True
        if batch_size != self.batch_size:
            self.batch_size, self.spec, self.plain, self.since_probe = batch_size, Measured(), Measured(), 0
        if self.spec.seconds is None:
            return True
        if self.plain.seconds is None:
            return False
        winner = self.spec.rate() >= self.plain.rate()
        self.since_probe += 1
        if self.since_probe >= REPROBE_EVERY:
            self.since_probe = 0
            return not winner
        return winner

    def observe(self, drafted: bool, seconds: float, tokens_per_request: float) -> None:
        """A finished round of the current batch size: its wall time and tokens committed per request."""
        (self.spec if drafted else self.plain).add(seconds, tokens_per_request)
