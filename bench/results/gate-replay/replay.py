"""The drafting gate's own cost, replayed on synthetic rounds (the numbers in models/decoding/drafting_gate.py).

Batch 1; a plain round takes 45 ms times the machine's speed, which drifts uniformly within +-15% every 60 rounds,
times per-round lognormal noise (sigma 0.08); a drafting round takes `cost` times as long and commits tokens drawn
from `tokens`. After a warm-up of 64 rounds the gate's output over `rounds` rounds is compared with plain decoding
under the same speeds: x plain decoding, mean and 10th percentile over 150 seeds. "doubling" is the gate without
the cost stretch (PROBE_COST infinite, waits up to 256 rounds), "stretched" the gate as it is.

    ~/.cache/dspark/venv/bin/python bench/results/gate-replay/replay.py > bench/results/gate-replay/replay.txt
"""
import random
import statistics

from dspark.models.decoding import drafting_gate

SCENARIOS = {  # name: (tokens per drafting round: (count, probability)..., drafting round / plain round)
    "embedded target (tau 1.6, rounds 3x)": (((1, .6), (2, .2), (3, .1), (4, .05), (7, .05)), 3.0),
    "every draft verified (tau 1.6, 1.9x)": (((1, .6), (2, .2), (3, .1), (4, .05), (7, .05)), 1.9),
    "loses narrowly (tau 1.13, 1.3x)": (((1, .9), (2, .07), (3, .03)), 1.3),
    "breaks even (tau 1.35, 1.35x)": (((1, .75), (2, .15), (3, .1)), 1.35),
    "wins (tau 1.7, 1.25x)": (((1, .62), (2, .2), (3, .1), (4, .05), (6, .03)), 1.25),
}
GATES = {"doubling": (float("inf"), 256), "stretched": (drafting_gate.PROBE_COST, drafting_gate.MAX_REPROBE_EVERY)}


def replay(tokens, cost, rounds, seed, warm_up=64):
    rng = random.Random(seed)
    gate = drafting_gate.DraftingGate("auto")
    seconds = committed = plain_seconds = 0.0
    for i in range(warm_up + rounds):
        if i % 60 == 0:
            speed = rng.uniform(0.85, 1.15)
        drafted = gate.drafts(1)
        plain = 0.045 * speed * rng.lognormvariate(0, 0.08)
        n = rng.choices(*zip(*tokens))[0] if drafted else 1
        gate.observe(1, drafted, plain * cost if drafted else plain, n)
        if i >= warm_up:
            seconds, committed, plain_seconds = seconds + (plain * cost if drafted else plain), committed + n, \
                plain_seconds + plain
    return committed / seconds / (rounds / plain_seconds)


def main():
    for name, (tokens, cost) in SCENARIOS.items():
        always = sum(n * p for n, p in tokens) / cost
        for rounds in (500, 1536):
            cells = []
            for gate, (probe_cost, longest) in GATES.items():
                drafting_gate.PROBE_COST, drafting_gate.MAX_REPROBE_EVERY = probe_cost, longest
                speeds = sorted(replay(tokens, cost, rounds, seed) for seed in range(150))
                cells.append(f"{gate} {statistics.mean(speeds):.3f}x (p10 {speeds[15]:.3f})")
            print(f"{name}, always drafting {always:.2f}x, {rounds} rounds: " + ", ".join(cells))


if __name__ == "__main__":
    main()
