"""STS: fitting recovers a known miscalibration, and the JSON round-trips through SGLang's own schema."""
import json
import os

import pytest
import torch

from dspark.models.decoding.sts import StsCalibration, calibrate, fit_sts, load_sts
from dspark.models.errors import ConfigError
from dspark.models.calibration import (CalibrationData, auroc, ece_rows, expected_calibration_error,
                                                   per_position)


def synthetic_rollouts(n=20000, gamma=4, true_temperatures=(2.0, 0.5, 3.0, 1.0), seed=0):
    """Confidence logits whose calibrated value sigma(c / t_true) is the real conditional acceptance rate."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, gamma, generator=gen) * 2 + 1
    p_accept = torch.sigmoid(logits / torch.tensor(true_temperatures))
    accepted_each = torch.rand(n, gamma, generator=gen) < p_accept
    accepted = accepted_each.long().cumprod(dim=1).sum(dim=1)
    return CalibrationData(logits, accepted, torch.full((n,), gamma))


def test_fit_recovers_the_true_temperatures_and_lowers_ece():
    data = synthetic_rollouts()
    temperatures = fit_sts(data)
    torch.testing.assert_close(temperatures, torch.tensor([2.0, 0.5, 3.0, 1.0], dtype=torch.float64), atol=0.25, rtol=0.1)
    fit, test = (CalibrationData(data.logits[part], data.accepted[part], data.verify_len[part])
                 for part in (slice(0, 10000), slice(10000, None)))  # rollouts are i.i.d.: halves are disjoint
    result = calibrate(fit, test, "synthetic")
    assert sum(result.ece_after) < 0.5 * sum(result.ece_before)


def test_ece_rows_equals_the_binned_definition_row_by_row():
    gen = torch.Generator().manual_seed(3)
    pred, label = torch.rand(7, 500, generator=gen, dtype=torch.float64), (torch.rand(500, generator=gen) < 0.4).double()
    expected = []
    for row in pred:  # sum_b n_b/N |mean(a)_b - mean(y)_b| over 20 equal-width bins, written out
        total = 0.0
        for b in range(20):
            inside = (row >= b / 20) & ((row < (b + 1) / 20) if b < 19 else (row <= 1))
            if inside.any():
                total += inside.sum() / 500 * abs(row[inside].mean() - label[inside].mean())
        expected.append(float(total))
    torch.testing.assert_close(ece_rows(pred, label), torch.tensor(expected, dtype=torch.float64))


def test_sts_preserves_ranking_at_the_first_position():
    data = synthetic_rollouts(n=5000)
    before = per_position(data)[0]["auroc"]
    after = per_position(data, fit_sts(data))[0]["auroc"]
    assert after == pytest.approx(before)


def test_metric_definitions_on_small_cases():
    pred, label = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auroc(pred, label) == pytest.approx(0.75)
    assert auroc(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0])) == pytest.approx(0.5)
    # bins of width 0.05: {0.1}: |0.1-0|, {0.4}: |0.4-0|, {0.35}: |0.35-1|, {0.8}: |0.8-1| -> mean
    assert expected_calibration_error(pred, label) == pytest.approx((0.1 + 0.4 + 0.65 + 0.2) / 4)


def test_json_is_sglang_schema_and_is_validated(tmp_path):
    from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

    path = tmp_path / "sts.json"
    StsCalibration([1.5, 0.9, 2.0], dataset="x", num_samples=10, ece_before=[0.1] * 3, ece_after=[0.01] * 3).save(path)
    assert load_sts_calibration_from_path(str(path)).temperatures == [1.5, 0.9, 2.0]
    assert load_sts(path, gamma=3).temperatures == [1.5, 0.9, 2.0]
    with pytest.raises(ConfigError, match="fit for gamma=3, but the drafter has gamma=5"):
        load_sts(path, gamma=5)
    for temperatures in ([1.0, -1.0], [1.0, float("inf")], [1.0, float("nan")]):  # JSON takes Infinity and NaN
        path.write_text(json.dumps({"temperatures": temperatures}))
        with pytest.raises(ConfigError, match=r"sts\.json: sts_temperatures must be (in \(0, inf\)|a finite number)"):
            load_sts(path, gamma=2)
    for content, problem in ((b"\xff\xfe", r"is not a DSparkStsCalibration JSON \(UnicodeDecodeError\)"),
                             (b"[1, 2]", "is not a DSparkStsCalibration JSON: "),
                             (b'{"temperatures": "hot"}', "temperatures must be a list of numbers, got"),
                             (b" " * (2 << 20), "is over 1048576 bytes")):
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=problem):
            load_sts(path, gamma=2)
    path.write_text(json.dumps({"temperatures": [1.5, 0.5], "fitted_by": "sglang"}))  # SGLang ignores extra fields
    assert load_sts(path, gamma=2).temperatures == [1.5, 0.5]
    os.mkfifo(tmp_path / "fifo.json")  # reading it would block until a writer came
    with pytest.raises(ConfigError, match="does not exist or is not a file"):
        load_sts(tmp_path / "fifo.json", gamma=2)
    with pytest.raises(ConfigError, match=r"does not exist or is not a file \(write one with `dspark calibrate`\)"):
        load_sts(tmp_path / "missing.json", gamma=2)
