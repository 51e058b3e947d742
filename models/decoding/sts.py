"""Sequential Temperature Scaling (paper §3.2.1): per-position temperatures for the confidence head.

The confidence head's c_k estimates P(d_k accepted | d_<k accepted); what allocation uses is the survival
a_k = prod_{i<=k} sigma(c_i / t_i). STS fits t_1..t_gamma left to right on held-out fixed-length rollouts: at
position k a 1-D grid search picks the t_k whose survival has the lowest ECE (20 equal-width bins), with
t_1..t_{k-1} already fixed. Dividing a logit by t > 0 preserves its order, so the ranking (AUROC) at position 1
is unchanged and only the calibration moves.

The JSON is SGLang 0.5.23's `DSparkStsCalibration` (`--speculative-dspark-confidence-sts-path`):
{"temperatures": [t_1..t_gamma], "dataset": str, "num_samples": int, "ece_before": [...], "ece_after": [...]};
SGLang applies sigmoid(c_k / t_k), as DraftBlock.confidence does with these temperatures.
"""
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import List

import torch

from dspark.models.calibration import CalibrationData, ece_rows, per_position
from dspark.models.decoding.settings import VerifySettings
from dspark.models.errors import SHOWN_CHARS, ConfigError, clipped, shown
from dspark.models.jsonl import read_json_file

# t in [0.25, 5.00] in steps of 0.01 (the paper leaves the grid unspecified).
DEFAULT_GRID = torch.arange(25, 501, dtype=torch.float64) / 100
KIND = "a DSparkStsCalibration JSON"
MAX_STS_BYTES = 1 << 20  # a real one is a few hundred bytes


@dataclass(frozen=True)
class StsCalibration:
    temperatures: List[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: List[float] = field(default_factory=list)
    ece_after: List[float] = field(default_factory=list)

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.temperatures, dtype=torch.float32)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def load_sts(path: Path, gamma: int) -> StsCalibration:
    """Read an STS JSON (ours or SGLang's) for a drafter with this gamma; ConfigError names what is wrong."""
    where = f"STS calibration {clipped(str(path), SHOWN_CHARS)}"
    raw = read_json_file(path, where, KIND, MAX_STS_BYTES, how_to_make="write one with `dspark calibrate`")
    if not isinstance(raw, dict) or "temperatures" not in raw:
        raise ConfigError(f"{where} is not {KIND}: an object with \"temperatures\"")
    # other fields are ignored, as SGLang's loader ignores them
    calibration = StsCalibration(**{f.name: raw[f.name] for f in fields(StsCalibration) if f.name in raw})
    temps = calibration.temperatures
    if not isinstance(temps, list) or not all(type(t) in (int, float) for t in temps):
        raise ConfigError(f"{where}: temperatures must be a list of numbers, got {shown(temps)}")
    if len(temps) != gamma:
        raise ConfigError(f"{where} was fit for gamma={len(temps)}, but the drafter has gamma={gamma}")
    try:
        VerifySettings(sts_temperatures=tuple(temps))  # the live setting's own bounds: finite and > 0
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    return calibration


def fit_sts(data: CalibrationData, grid: torch.Tensor = DEFAULT_GRID) -> torch.Tensor:
    """The STS temperatures [gamma] float64 for these rollouts (module docstring)."""
    gamma = data.logits.shape[1]
    logits, labels, observed = data.logits.double(), data.labels, data.observed
    temperatures = torch.ones(gamma, dtype=torch.float64)
    prefix = torch.ones(logits.shape[0], dtype=torch.float64)  # prod_{i<k} sigma(c_i / t_i)
    for k in range(gamma):
        rows = observed[:, k]
        if rows.any():
            candidates = prefix[rows] * torch.sigmoid(logits[rows, k] / grid.unsqueeze(1))  # [grid, rows]
            temperatures[k] = grid[int(ece_rows(candidates, labels[rows, k]).argmin())]
        prefix = prefix * torch.sigmoid(logits[:, k] / temperatures[k])
    return temperatures


def calibrate(fit_data: CalibrationData, test_data: CalibrationData, dataset: str) -> StsCalibration:
    """Fit on one set of rollouts, report per-position ECE before and after on a disjoint one."""
    temperatures = fit_sts(fit_data)
    before = [row["ece"] for row in per_position(test_data)]
    after = [row["ece"] for row in per_position(test_data, temperatures)]
    return StsCalibration(temperatures=[round(float(t), 4) for t in temperatures], dataset=dataset,
                          num_samples=int(fit_data.logits.shape[0]), ece_before=before, ece_after=after)
