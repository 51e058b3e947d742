"""Whether a round drafts at all: speculation must never be slower than the target alone.

A speculative round of the batch costs the drafting pass plus a verify forward over sum(1 + k) tokens and
commits tau tokens per request; a plain round (no drafter call, only the anchor verified) costs one decode
forward and commits exactly one. The gate measures both online, as the engine runs them, and drafts only while

    tau_spec / seconds_spec  >=  1 / seconds_plain          (tokens per request per second)

Every estimate is an exponential moving average of the rounds measured at one batch size (costs depend on it),
kept per size for the decoder's lifetime (all its generate calls: one target, drafter and policy): under
continuous batching the size moves by one as requests finish and join, and a size seen before is decided on what
was measured there. A size not yet measured on both sides follows the nearest size that is; until some size is,
the gate explores: a speculative round, then a plain one.

A round's tokens per request average its b requests, so it carries the evidence of b rounds of one request and
weighs as much: the newest round gets weight 1 - (1 - SMOOTHING)^b (0.3 at batch 1, 0.94 at batch 8). At batch 1
one short round (acceptance varies a lot from round to round) does not switch drafting off; at batch 8, when the
easy first rounds of the replies give way to harder text, the gate stops drafting after one losing round instead
of following a slow average for several (with weight 0.3 at every size that lag cost DSpark, every draft
verified, 10% at batch 8).

Whichever side loses is re-measured after REPROBE_EVERY rounds, so a drafter that starts paying (easier text, a
smaller batch) is picked up again, and a new size gets both sides. Each re-probe that leaves the verdict as it
was doubles the wait, up to MAX_REPROBE_EVERY; a changed verdict starts again at REPROBE_EVERY. A re-probe of a
losing drafter costs one speculative round (2-3 decode steps on a CPU), so a fixed interval of 16 would cost up
to ~8%; the backoff keeps that to a few percent.

Skipping drafting changes how many tokens a round commits, never which: a plain round verifies the anchor alone,
which is ordinary decoding from the target (greedy identity and the sampled distribution hold either way).

    auto     the gate above (the default: generation, the demo, speed benchmarks, serving)
    always   draft every round (DeepSpec's protocol; acceptance measurements, `dspark eval`)
    never    plain decoding through the same loop (served: turns speculation off without a restart)

The mode is the `drafting` setting (settings.py: its one definition).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dspark.models.decoding.settings import DRAFTING_MODES
from dspark.models.errors import ConfigError

SMOOTHING = 0.3
REPROBE_EVERY = 16
MAX_REPROBE_EVERY = 256


@dataclass
class Measured:
    """EWMA of one kind of round at one batch size."""
    seconds: Optional[float] = None
    tokens_per_request: Optional[float] = None

    def add(self, seconds: float, tokens_per_request: float, weight: float) -> None:
        if self.seconds is None:
            self.seconds, self.tokens_per_request = seconds, tokens_per_request
            return
        self.seconds += weight * (seconds - self.seconds)
        self.tokens_per_request += weight * (tokens_per_request - self.tokens_per_request)

    def rate(self) -> float:
        return self.tokens_per_request / self.seconds if self.seconds else float("inf")


@dataclass
class Sides:
    """Both kinds of round, measured at one batch size."""
    spec: Measured = field(default_factory=Measured)
    plain: Measured = field(default_factory=Measured)

    def known(self) -> bool:
        return self.spec.seconds is not None and self.plain.seconds is not None

    def drafting_wins(self) -> bool:
        return self.spec.rate() >= self.plain.rate()


@dataclass
class DraftingGate:
    mode: str = "auto"
    sizes: dict[int, Sides] = field(default_factory=dict)  # batch size -> its measurements
    since_probe: int = 0  # rounds since the losing side was last measured
    probe_every: int = REPROBE_EVERY  # rounds between re-probes (doubles while the verdict holds)
    verdict: Optional[bool] = None  # whether drafting won, at the last decision

    def __post_init__(self) -> None:
        if self.mode not in DRAFTING_MODES:
            raise ConfigError(f"drafting must be one of {'|'.join(DRAFTING_MODES)}, got {self.mode!r}")

    def drafts(self, batch_size: int) -> bool:
        """Whether the next round, of `batch_size` requests, drafts."""
        if self.mode != "auto":
            return self.mode == "always"
        known = [size for size, sides in self.sizes.items() if sides.known()]
        if not known:  # explore: speculative first, then plain
            here = self.sizes.get(batch_size, Sides())
            return here.spec.seconds is None
        winner = self.sizes[min(known, key=lambda size: (abs(size - batch_size), size))].drafting_wins()
        if winner != self.verdict:
            self.verdict, self.probe_every = winner, REPROBE_EVERY
        self.since_probe += 1
        if self.since_probe >= self.probe_every:
            self.since_probe, self.probe_every = 0, min(2 * self.probe_every, MAX_REPROBE_EVERY)
            return not winner
        return winner

    def observe(self, batch_size: int, drafted: bool, seconds: float, tokens_per_request: float) -> None:
        """A finished round of `batch_size` requests: its wall time and tokens committed per request."""
        sides = self.sizes.setdefault(batch_size, Sides())
        weight = 1 - (1 - SMOOTHING) ** batch_size  # the round averages batch_size requests (module docstring)
        (sides.spec if drafted else sides.plain).add(seconds, tokens_per_request, weight)
