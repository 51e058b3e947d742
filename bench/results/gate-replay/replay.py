"""The drafting gate's own cost, replayed on synthetic rounds (the numbers in models/decoding/drafting_gate.py).

Batch 1; a plain round takes 45 ms times the machine's speed, which drifts uniformly within +-15% every 60 rounds,
times per-round lognormal noise (sigma 0.08); a drafting round takes `cost` times as long and commits tokens drawn
from `tokens`. On the "stalls" machine the CPU also stalls now and then, as a shared VM does: a stall of 2-10 plain
rounds' time arrives at random in wall time, once every 2.25 s (50 plain rounds) on average, whatever runs. After a
warm-up of 64 rounds the gate's output over `rounds` rounds is compared with plain decoding on the same machine
(the same speeds, stalls drawn alike): x plain decoding, mean and 10th percentile over 150 seeds. Gates:
"doubling" re-probes after doubling waits up to 256 rounds, "stretched" also stretches them to the probe budget,
"as is" also clips each round's time to OUTLIER_ROUND times its window's median.

    ~/.cache/dspark/venv/bin/python bench/results/gate-replay/replay.py > bench/results/gate-replay/replay.txt
"""
import math
import random
import statistics

from dspark.models.decoding import drafting_gate

SCENARIOS = {  # name: (tokens per drafting round: (count, probability)..., drafting round / plain round)
    "embedded target (tau 1.6, rounds 3x)": (((1, .6), (2, .2), (3, .1), (4, .05), (7, .05)), 3.0),
    "every draft verified (tau 1.6, 1.9x)": (((1, .6), (2, .2), (3, .1), (4, .05), (7, .05)), 1.9),
    "loses narrowly (tau 1.13, 1.3x)": (((1, .9), (2, .07), (3, .03)), 1.3),
    "breaks even (tau 1.35, 1.35x)": (((1, .75), (2, .15), (3, .1)), 1.35),
    "wins (tau 1.7, 1.25x)": (((1, .62), (2, .2), (3, .1), (4, .05), (6, .03)), 1.25),
    "wins with costly rounds (tau 3.55, 3x)": (((1, .35), (2, .1), (3, .1), (4, .1), (5, .1), (6, .1), (8, .15)), 3.0),
}
GATES = {  # name: (PROBE_COST, MAX_REPROBE_EVERY, OUTLIER_ROUND)
    "doubling": (float("inf"), 256, float("inf")),
    "stretched": (drafting_gate.PROBE_COST, drafting_gate.MAX_REPROBE_EVERY, float("inf")),
    "as is": (drafting_gate.PROBE_COST, drafting_gate.MAX_REPROBE_EVERY, drafting_gate.OUTLIER_ROUND),
}
MACHINES = {"quiet": float("inf"), "stalls": 2.25}  # mean seconds between stalls
PLAIN_SECONDS = 0.045


def replay(tokens, cost, rounds, seed, stall_every, warm_up=64):
    rng = random.Random(seed)
    gate = drafting_gate.DraftingGate("auto")

    def with_stall(work):  # a stall arrives in `work` seconds with the Poisson probability
        stalled = rng.random() < 1 - math.exp(-work / stall_every)
        return work + (PLAIN_SECONDS * rng.uniform(2, 10) if stalled else 0.0)

    seconds = committed = plain_seconds = 0.0
    for i in range(warm_up + rounds):
        if i % 60 == 0:
            speed = rng.uniform(0.85, 1.15)
        drafted = gate.drafts(1)
        plain = PLAIN_SECONDS * speed * rng.lognormvariate(0, 0.08)
        took = with_stall(plain * cost if drafted else plain)
        n = rng.choices(*zip(*tokens))[0] if drafted else 1
        gate.observe(1, drafted, took, n)
        if i >= warm_up:
            seconds, committed, plain_seconds = seconds + took, committed + n, plain_seconds + with_stall(plain)
    return committed / seconds / (rounds / plain_seconds)


def main():
    for name, (tokens, cost) in SCENARIOS.items():
        always = sum(n * p for n, p in tokens) / cost
        for machine, stall_every in MACHINES.items():
            for rounds in (500, 1536):
                cells = []
                for gate, settings in GATES.items():
                    drafting_gate.PROBE_COST, drafting_gate.MAX_REPROBE_EVERY, drafting_gate.OUTLIER_ROUND = settings
                    speeds = sorted(replay(tokens, cost, rounds, seed, stall_every) for seed in range(150))
                    cells.append(f"{gate} {statistics.mean(speeds):.3f}x (p10 {speeds[15]:.3f})")
                print(f"{name}, always drafting {always:.2f}x, {machine}, {rounds} rounds: " + ", ".join(cells),
                      flush=True)


if __name__ == "__main__":
    main()
