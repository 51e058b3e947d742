"""Calibration kept true from live traffic: a sliding window of what the confidence head predicted and what the
target then accepted, per-position ECE and survival gap from it, and STS refits on it.

Each verified round adds one row per request: the head's raw confidence logits c_1..c_gamma, the drafts
verified l_r and the drafts accepted n_r (SGLang's `correct_len`). Position k of that row is labelled when it was
verified (k <= l_r): survival label y_k = [n_r >= k], the event a_k = prod_{i<=k} sigma(c_i / t_i) predicts.
Verification is lossless, so these labels are exactly the target's verdicts; positions the allocator cut stay
unlabelled (models/calibration.py's CalibrationData, the same structure `dspark calibrate` fits on).
Cut rounds alone would label only the prefixes the head was confident about; the planner's probe rounds
(`probe_round_ratio`, verified in full) label every position whatever the head said, and are counted apart.

    report     per-position ECE (20 bins) and survival gap (mean predicted a_k - realized rate) under the
               temperatures in effect, over the rows since those temperatures were installed
    refit      models/decoding/sts.py's fit_sts on the window: the same fitting code as `dspark calibrate`

The window holds the last LIVE_WINDOW_ROWS rows and is cleared whenever the temperatures change, so the report always
describes the calibration in effect.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

import torch

from dspark.models.decoding.sts import fit_sts
from dspark.models.errors import ConfigError
from dspark.models.calibration import LIVE_WINDOW_ROWS, CalibrationData, per_position


class LiveCalibration:
    def __init__(self, size: int = LIVE_WINDOW_ROWS):
        self.rows: deque = deque(maxlen=size)  # (logits [gamma] float32, verify_len, accepted, probe)

    def reset(self) -> None:
        self.rows.clear()

    def observe(self, logits: torch.Tensor, verify_lens: torch.Tensor, accepted: torch.Tensor,
                probe: bool = False) -> None:
        """logits [bs, gamma] raw confidence logits; verify_lens, accepted [bs] long drafts, accepted <= verified;
        probe: the round was verified in full."""
        logits = logits.detach().float().cpu()
        for row, length, count in zip(logits, verify_lens.tolist(), accepted.tolist()):
            if length > 0:  # nothing verified: nothing labelled
                self.rows.append((row, length, count, probe))

    def data(self) -> Optional[CalibrationData]:
        if not self.rows:
            return None
        logits, verify, accepted, _ = zip(*self.rows)
        return CalibrationData(torch.stack(logits), torch.tensor(accepted), torch.tensor(verify))

    def report(self, temperatures: Optional[torch.Tensor]) -> dict:
        data = self.data()
        if data is None:
            return {"samples": 0, "probe_samples": 0, "ece": [], "survival_gap": [], "labelled": []}
        rows = per_position(data, None if temperatures is None else temperatures.double().cpu())
        finite = lambda x: x if x == x else None  # noqa: E731  (a position nothing labelled yet: null, not NaN)
        return {"samples": len(self.rows), "probe_samples": sum(row[3] for row in self.rows),
                "labelled": [r["samples"] for r in rows],
                "ece": [finite(r["ece"]) for r in rows],
                "survival_gap": [finite(r["pred_mean"] - r["target_mean"]) for r in rows]}

    def refit(self, min_samples: int) -> list[float]:
        """STS temperatures fitted on the window; a ConfigError when it holds fewer than min_samples rows."""
        if len(self.rows) < max(1, min_samples):
            raise ConfigError(f"the live calibration window holds {len(self.rows)} labelled request-rounds; the "
                              f"refit needs at least {max(1, min_samples)}: serve more traffic first")
        return [round(float(t), 4) for t in fit_sts(self.data())]
