"""One evaluation: decode a dataset's prompts speculatively, measure acceptance, calibration and speed.

Protocol (DeepSpec's, docs/evaluation.md): fixed-length proposals (every draft verified) unless a policy is given,
temperature 1 by default, one generator per batch seeded with seed + the batch's first prompt index. The same
prompts are then decoded without speculation (the drafter-free path of the same engine) for the baseline
tokens/s; at temperature > 0 the two runs sample different texts, so speed is compared per generated token.
"""
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
from tqdm import tqdm

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding.engine import Generation, GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.drafters.base import Drafter
from dspark.models.errors import ConfigError
from dspark.models.evaluation.acceptance import acceptance_summary, calibration_rounds
from dspark.models.calibration import CalibrationData, mean_metric, per_position

DEEPSPEC_SEED = 980406
# The prefill's token, a speculative round of up to gamma + 1 and a plain round fit in it for gamma <= 14, so no
# request finishes before its drafting gate has measured both kinds of round at the warm-up's batch size.
WARM_UP_TOKENS = 16


def warm_up(decoders: Sequence[SpeculativeDecoder], prompts: Sequence[List[int]], config: GenerationConfig,
            seed: int = DEEPSPEC_SEED, max_running: Optional[int] = None) -> None:
    """A short untimed decode of `prompts` per decoder, before anything is timed: first-call costs (allocations,
    thread pools) stay out of the measurement, and each decoder's drafting gate measures both kinds of round at
    this batch size, as an engine that has been serving for a while has. Timed runs still pay the gate's
    re-probes."""
    short = GenerationConfig(min(WARM_UP_TOKENS, config.max_new_tokens), config.sampling, config.eos_token_ids)
    for decoder in decoders:
        decoder.generate(list(prompts), short, torch.Generator().manual_seed(seed), max_running=max_running)


@dataclass(frozen=True)
class EvalSettings:
    max_new_tokens: int = 256
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(1.0))
    batch_size: int = 1
    seed: int = DEEPSPEC_SEED
    baseline: bool = True  # also decode without speculation for tokens/s

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")


def decode_all(decoder: SpeculativeDecoder, prompts: Sequence[List[int]], settings: EvalSettings,
               eos_token_ids: tuple, desc: str) -> Tuple[List[Generation], float]:
    """Every prompt, in batches of settings.batch_size, with a progress bar. -> (generations, wall seconds)"""
    config = GenerationConfig(settings.max_new_tokens, settings.sampling, eos_token_ids)
    generations, wall = [], 0.0
    for start in tqdm(range(0, len(prompts), settings.batch_size), desc=desc, unit="batch", leave=False):
        generator = torch.Generator().manual_seed(settings.seed + start)
        begin = time.perf_counter()
        generations += decoder.generate(prompts[start:start + settings.batch_size], config, generator)
        wall += time.perf_counter() - begin
    return generations, wall


def calibration_data(generations: Sequence[Generation]) -> Optional[CalibrationData]:
    rounds = calibration_rounds(generations)
    if not rounds:
        return None
    logits, accepted, verify_len = zip(*rounds)
    return CalibrationData(torch.tensor(logits), torch.tensor(accepted), torch.tensor(verify_len))


def calibration_report(data: CalibrationData, temperatures: Optional[torch.Tensor]) -> dict:
    rows = per_position(data, temperatures)
    return {"positions": rows, **{f"{key}_mean": mean_metric(rows, key) for key in ("ece", "auroc", "brier")}}


def evaluate(target: torch.nn.Module, drafter: Drafter, prompts: Sequence[List[int]], settings: EvalSettings,
             eos_token_ids: tuple, policy: VerifyLengthPolicy = VerifyLengthPolicy.of("fixed"),
             sts_temperatures: Optional[torch.Tensor] = None, desc: str = "eval",
             drafting: str = "always") -> Tuple[dict, List[Generation]]:
    """Metrics for one dataset (module docstring) and the speculative generations behind them."""
    decoder = SpeculativeDecoder(target, drafter, policy, sts_temperatures, drafting)
    generations, wall = decode_all(decoder, prompts, settings, eos_token_ids, f"{desc} speculative")
    result = {**acceptance_summary(generations, drafter.config.gamma), "prompts": len(prompts), "wall_s": wall}
    result["tokens_per_s"] = result["generated_tokens"] / wall
    calibration = calibration_data(generations)
    if calibration is not None:
        result["calibration"] = calibration_report(calibration, sts_temperatures)
    if settings.baseline:
        baseline, base_wall = decode_all(SpeculativeDecoder(target), prompts, settings, eos_token_ids,
                                         f"{desc} baseline")
        result["baseline_tokens_per_s"] = sum(len(g.token_ids) for g in baseline) / base_wall
        result["speedup"] = result["tokens_per_s"] / result["baseline_tokens_per_s"]
    return result, generations
