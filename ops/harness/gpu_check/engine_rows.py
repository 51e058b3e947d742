"""The reference engine (models/decoding) decoding the embedded target with its DSpark drafter on the device.

embedded/target alone, then with embedded/dspark verifying every draft (policy fixed) and verifying what the
causal allocator admits on the SPS curve profiled here (policy causal), all greedy: each must emit exactly the
target alone's tokens. The three decoders take turns batch by batch (models/evaluation/paired.py); the speedup
is the median of the paired tokens/s ratios to the target alone, tau the tokens committed per verify round. The
drafter loads as serving loads it, through the target (its embedding and lm_head are the target's).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.kernels.warping import GREEDY
from dspark.models.decoding.engine import Generation, GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.loading import Target, load_drafter_for
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.evaluation.acceptance import acceptance_summary
from dspark.models.evaluation.paired import format_ratio, paired_ratio, timed_in_turns
from dspark.models.evaluation.run import warm_up
from dspark.ops.commands.decoding_args import startup_sps
from dspark.ops.harness.gpu_check.table import FAILED, PASSED, Row

POLICIES = ("fixed", "causal")
# The embedded target was trained on the CPython standard library: it continues code.
CODE_PROMPTS = ("def __init__(self", "import os\nimport sys\n\n\ndef main(", "for i in range(", "class Node:\n    ",
                "    def __repr__(self):\n        return", "with open(path) as f:\n    ", "try:\n    import",
                "def parse_args(argv=None):\n    parser = ")
SEED = 0


@dataclass(frozen=True)
class EngineShapes:
    prompts: int  # of CODE_PROMPTS
    batch_size: int
    max_new_tokens: int
    repeats: int  # turns of every decoder over every batch


def checks() -> list[str]:
    return [f"engine: target + dspark drafter, {policy}, greedy" for policy in POLICIES]


def engine_rows(target: Target, drafter_dir: Path, shapes: EngineShapes) -> list[Row]:
    drafter = load_drafter_for(drafter_dir, target, cpu_linears="default")
    gamma = drafter.config.gamma
    device = next(target.model.parameters()).device
    setup = (f"{device}, {drafter_dir.name} gamma {gamma}, batch {shapes.batch_size}, {shapes.prompts} prompts x "
             f"{shapes.max_new_tokens} tokens")
    prompts = [target.tokenizer.encode(text) for text in CODE_PROMPTS[:shapes.prompts]]
    config = GenerationConfig(shapes.max_new_tokens, GREEDY, target.eos_token_ids)
    sps = startup_sps(target.model, gamma + 1, shapes.batch_size)
    runs = {"none": SpeculativeDecoder(target.model)}
    runs |= {policy: SpeculativeDecoder(target.model, drafter, VerifyLengthPolicy.of(policy, sps=sps))
             for policy in POLICIES}
    warm_up(list(runs.values()), prompts[:shapes.batch_size], config, SEED)
    walls, outputs, identical = timed_in_turns(runs, prompts, shapes.batch_size, config, shapes.repeats, SEED,
                                               "gpu-check engine")
    rates = {kind: [sum(len(g.token_ids) for g in outputs[kind]) / wall for wall in walls[kind]] for kind in runs}
    rows = []
    for check, policy in zip(checks(), POLICIES):
        summary = acceptance_summary(outputs[policy], gamma)
        notes = (f"speedup {format_ratio(*paired_ratio(rates[policy], rates['none']))}, tau {summary['tau']:.2f}, "
                 f"{summary['mean_verify_len']:.2f} drafts verified a round")
        if not identical[policy]:
            notes = first_difference(target, prompts, outputs["none"], outputs[policy]) + "; " + notes
        rows.append(Row(check, setup, PASSED if identical[policy] else FAILED, None,
                        f"{statistics.median(rates['none']):.0f} tok/s", f"{statistics.median(rates[policy]):.0f} tok/s",
                        notes))
    return rows


def first_difference(target: Target, prompts: list, plain: list[Generation], speculative: list[Generation]) -> str:
    """Where the speculative output first leaves the target alone's, with the target's margin between its top two
    logits there: a margin near float32 rounding says the verify forward's other matmul shapes flipped a near-tie
    (the rule is lossless in exact arithmetic), a wide one says a bug."""
    for index, (alone, drafted) in enumerate(zip(plain, speculative)):
        if alone.token_ids != drafted.token_ids:
            pairs = zip(alone.token_ids, drafted.token_ids)
            at = next((k for k, (a, b) in enumerate(pairs) if a != b), min(len(alone.token_ids), len(drafted.token_ids)))
            device = next(target.model.parameters()).device
            with torch.no_grad():
                logits = target.model(torch.tensor([prompts[index] + alone.token_ids[:at]], device=device)).logits
            top = logits[0, -1].float().topk(2).values
            return (f"greedy output differs from the target alone's: prompt {index}, token {at}, where the target's "
                    f"top-2 logit margin is {float(top[0] - top[1]):.2g}")
    return "greedy output differs from the target alone's"
