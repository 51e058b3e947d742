"""Whether a round drafts at all: speculation must never be slower than the target alone.

A speculative round of the batch costs the drafting pass plus a verify forward over sum(1 + k) tokens and
commits tau tokens per request; a plain round (no drafter call, only the anchor verified) costs one decode
forward and commits exactly one. The gate measures both online, as the engine runs them, and drafts only while

    tau_spec / seconds_spec  >=  1 / seconds_plain          (tokens per request per second)

Each side's estimate, at one batch size, is a ratio over its latest rounds holding WINDOW_REQUESTS request-rounds
(a round of b requests counts b: it averages b requests' tokens), tokens committed per request over seconds:

    rate = sum(tokens per request) / sum(seconds)        over the side's last ceil(WINDOW_REQUESTS / b) rounds

so every decision rests on the same evidence at any batch size: 16 rounds at batch 1, where one request's tokens
per round vary a lot (SmolLM2's DSpark drafter on the demo's prompts: 1 token in 62% of its rounds, 1.5 on
average), and the latest 2 rounds at batch 8, so a batch whose replies turn hard stops drafting within two rounds.
Estimates are kept per size for the decoder's lifetime (all its generate calls: one target, drafter and policy):
under continuous batching the size moves by one as requests finish and join, and a size seen before is decided
on what was measured there. A size not yet measured on both sides follows the nearest size that is; until some
size is, the gate explores: SPEC_PROBE_REQUESTS request-rounds of speculation, then PLAIN_PROBE_REQUESTS plain.

The losing side is re-measured after REPROBE_EVERY rounds, by a burst of ceil(its PROBE_REQUESTS / b) rounds. A
single round at batch 1 is too noisy to overturn a verdict (an exponential average with one round's weight 0.3 at
batch 1 left the demo decoding plainly in 229 of 287 rounds while its speculative rounds were 1.22x faster), and so
is a burst of 4 speculative rounds: at batch 1 most of them commit one token and the few that commit 3-6 are what
make drafting pay (SmolLM2's chat drafter on the demo's prompts), so 4 often held none of them and turned a winning
drafter off for the next 16-64 rounds. Speculation is therefore measured over 8 request-rounds, plain decoding (one
token every round; only its time varies) over 4: `make demo` 1.21x against 1.15x over six alternating pairs, with
the engine's whole-round planner (bench/results/smollm2/whole_round_planning). The longer burst costs a drafter that
loses badly a little more: replaying a traced demo with every speculative round twice as slow (0.63x when always
drafting), ~1000 tokens at batch 1 end at 0.96x against 0.98x with bursts of 4.

Each re-probe that leaves the verdict as it was doubles the wait, up to MAX_REPROBE_EVERY; a changed verdict starts
again at REPROBE_EVERY. Once a verdict has held through two re-probes, the wait is also stretched until re-probing
costs at most PROBE_COST of the time. A burst of n losing rounds of s_lose seconds each does a share
f = 1 - rate_lose / rate_win less work than the winner would have done in that time, so it wastes f * n * s_lose
seconds; spread over `wait` winning rounds of s_win seconds that is at most PROBE_COST when

    wait  >=  f * n * s_lose / (PROBE_COST * s_win)

A drafter that loses narrowly is re-probed as often as doubling alone would; the further one loses, the longer
the wait. On the embedded target, whose drafters cost about as much as it does, a drafting round costs 2.3 plain
rounds (11.2 against 4.9 ms, DSpark at batch 1). Replayed through this gate on synthetic rounds at batch 1
(bench/results/gate-replay/: 150 seeds, the machine's speed drifting +-15% every 60 rounds, after a warm-up of 64),
a drafter whose rounds cost 3 plain ones (tau 1.6, 0.62x when always drafting) ran at 0.933x of plain decoding over
500 tokens and 0.952x over 1536 with doubling alone (up to 256), and at 0.965x and 0.976x with the stretch; one
that loses narrowly (0.87x) went from 0.981x to 0.984x, and a winning one (1.36x) stayed at 1.32x. Stretching after
the first confirming re-probe already gained more for the losing drafter (0.982x over 500 tokens) but cost the
winning one 1% (1.315x): one unlucky stretch of a winning drafter's rounds can turn the verdict to plain decoding
and a re-probe confirm it, and the stretch would then keep the drafter off for long.

Each round's time counts at most OUTLIER_ROUND times the median round of its window. A shared machine stalls now
and then (its neighbours, a garbage collection, a first call), and one stalled round among the 4 of a plain probe
makes plain decoding look several times slower: Eagle3 on the embedded target, whose rounds run at 0.45x of plain
decoding, once measured 2.7x right after exploring and drafted through 137 rounds, until newer plain rounds had
pushed the stalled one out of the window (157 of 2428 rounds drafted in that run; 48 and 72 of about 2470 in two
runs with the clip). A drafting round's honest variation, verifying from none to all of its drafts, stays within 2x
(embedded target: 11 to 15 ms). Replayed with stalls of 2-10 plain rounds arriving once every 50 plain rounds' time
on average, the 3x drafter above ran at 0.974x over 1536 rounds (0.925x without the clip), the narrow loser at
0.984x (0.930x), the winner at 1.32x (1.31x); on a quiet machine the clip changes nothing. A drafter that wins with
costly rounds (tau 3.55 at 3x) ran at 1.13x, as on a quiet machine, instead of 1.17x: unclipped, the stalls bias
plain decoding's short windows against it, which happens to favour that drafter and costs every losing one 4-5%.

Skipping drafting changes how many tokens a round commits, never which: a plain round verifies the anchor alone,
which is ordinary decoding from the target (greedy identity and the sampled distribution hold either way).

    auto     the gate above (the default: generation, the demo, speed benchmarks, serving)
    always   draft every round (DeepSpec's protocol; acceptance measurements, `dspark eval`)
    never    plain decoding through the same loop (served: turns speculation off without a restart)

The mode is the `drafting` setting (settings.py: its one definition).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from dspark.models.decoding.settings import DRAFTING_MODES
from dspark.models.errors import ConfigError

WINDOW_REQUESTS = 16
SPEC_PROBE_REQUESTS = 8
PLAIN_PROBE_REQUESTS = 4
REPROBE_EVERY = 16
MAX_REPROBE_EVERY = 1024
PROBE_COST = 0.02
OUTLIER_ROUND = 2.0


def rounds_for(requests: int, batch_size: int) -> int:
    """Rounds of batch_size requests that hold `requests` request-rounds (at least one)."""
    return max(1, -(-requests // batch_size))


def probe_rounds(drafting: bool, batch_size: int) -> int:
    """Rounds that measure one side: speculation's tokens per round vary, a plain round's do not."""
    return rounds_for(SPEC_PROBE_REQUESTS if drafting else PLAIN_PROBE_REQUESTS, batch_size)


@dataclass
class Measured:
    """The latest rounds of one kind at one batch size: (seconds, tokens per request) each, and their totals over
    the window, each round's seconds at most OUTLIER_ROUND times the window's median round (kept by `add`, the only
    change to the window: the gate reads them every round)."""
    rounds: deque = field(default_factory=deque)
    seconds: float = 0.0
    tokens: float = 0.0

    def add(self, seconds: float, tokens_per_request: float, batch_size: int) -> None:
        self.rounds.append((seconds, tokens_per_request))
        while len(self.rounds) > rounds_for(WINDOW_REQUESTS, batch_size):
            self.rounds.popleft()
        longest = OUTLIER_ROUND * statistics.median(s for s, _ in self.rounds)
        self.seconds = sum(min(s, longest) for s, _ in self.rounds)
        self.tokens = sum(t for _, t in self.rounds)

    def rate(self) -> float:
        """Tokens per request per second over the window."""
        return self.tokens / self.seconds if self.seconds else float("inf")

    def round_seconds(self) -> float:
        return self.seconds / len(self.rounds)


@dataclass
class Sides:
    """Both kinds of round, measured at one batch size."""
    spec: Measured = field(default_factory=Measured)
    plain: Measured = field(default_factory=Measured)

    def known(self, batch_size: int) -> bool:
        return (len(self.spec.rounds) >= probe_rounds(True, batch_size)
                and len(self.plain.rounds) >= probe_rounds(False, batch_size))

    def drafting_wins(self) -> bool:
        return self.spec.rate() >= self.plain.rate()

    def costly_wait(self, batch_size: int) -> float:
        """Winning rounds between re-probes for re-probing the loser to cost PROBE_COST of the time."""
        win, lose = (self.spec, self.plain) if self.drafting_wins() else (self.plain, self.spec)
        if not win.round_seconds():  # rounds timed at 0 s (a coarse clock): nothing to weigh the cost against
            return float("inf")
        wasted = 1.0 - lose.rate() / win.rate()
        burst = probe_rounds(lose is self.spec, batch_size)
        return wasted * burst * lose.round_seconds() / (PROBE_COST * win.round_seconds())


@dataclass
class DraftingGate:
    mode: str = "auto"
    sizes: dict[int, Sides] = field(default_factory=dict)  # batch size -> its measurements
    since_probe: int = 0  # rounds since the losing side was last measured
    probe_every: int = REPROBE_EVERY  # rounds between re-probes (doubles while the verdict holds)
    verdict: Optional[bool] = None  # whether drafting won, at the last decision
    probing: int = 0  # rounds left in the current re-probe burst of the losing side

    def __post_init__(self) -> None:
        if self.mode not in DRAFTING_MODES:
            raise ConfigError(f"drafting must be one of {'|'.join(DRAFTING_MODES)}, got {self.mode!r}")

    def drafts(self, batch_size: int) -> bool:
        """Whether the next round, of `batch_size` requests, drafts."""
        if self.mode != "auto":
            return self.mode == "always"
        known = [size for size, sides in self.sizes.items() if sides.known(size)]
        if not known:  # explore: speculative rounds first, then plain ones
            here = self.sizes.get(batch_size, Sides())
            return len(here.spec.rounds) < probe_rounds(True, batch_size)
        sides = self.sizes[min(known, key=lambda size: (abs(size - batch_size), size))]
        winner = sides.drafting_wins()
        if winner != self.verdict:
            self.verdict, self.probe_every, self.probing = winner, REPROBE_EVERY, 0
        if self.probing:  # inside a re-probe burst of the losing side
            self.probing -= 1
            return not winner
        self.since_probe += 1
        if self.reprobe_due(sides, batch_size):
            self.since_probe, self.probe_every = 0, min(2 * self.probe_every, MAX_REPROBE_EVERY)
            self.probing = probe_rounds(not winner, batch_size) - 1
            return not winner
        return winner

    def reprobe_due(self, sides: Sides, batch_size: int) -> bool:
        """Whether the losing side is re-probed now: probe_every rounds after the last re-probe, and once the
        verdict has held through two re-probes (probe_every has doubled twice) not before re-probing costs at
        most PROBE_COST of the time (worked out only then: the gate runs every round)."""
        if self.since_probe < self.probe_every:
            return False
        if self.probe_every < 4 * REPROBE_EVERY:
            return True
        return self.since_probe >= min(sides.costly_wait(batch_size), MAX_REPROBE_EVERY)

    def observe(self, batch_size: int, drafted: bool, seconds: float, tokens_per_request: float) -> None:
        """A finished round of `batch_size` requests: its wall time and tokens committed per request."""
        sides = self.sizes.setdefault(batch_size, Sides())
        (sides.spec if drafted else sides.plain).add(seconds, tokens_per_request, batch_size)
