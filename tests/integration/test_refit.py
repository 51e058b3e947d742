"""Refits from live traffic (integration/refit.py) on a real runtime state store and calibration window, held in a
scheduler state as the plugin's hooks leave it: the automatic STS refit when ECE crosses the live threshold, and
the SPS refit written as a roll-backable table."""
import json
from pathlib import Path

import pytest
import torch

from dspark.integration import calibration, refit
from dspark.integration.runtime_state import RuntimeStateStore
from dspark.integration.scheduler_state import SchedulerState
from dspark.kernels.sps import SpsTable
from dspark.models.calibration import LIVE_WINDOW_ROWS
from dspark.models.decoding.settings import VerifySettings
from dspark.models.errors import ConfigError

GAMMA = 3


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A scheduler process's state once its planner exists."""
    table = tmp_path / "sps.json"
    SpsTable((1, 4, 16), (100.0, 80.0, 40.0), 32).save(table)
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    return SchedulerState(store=RuntimeStateStore(VerifySettings(sps_table=str(table)), GAMMA))


def serve_overconfident_rounds(window: calibration.LiveCalibration, rows: int) -> None:
    """Rounds whose every draft survives with probability sigmoid(c) while the state's temperatures 0.25 claim
    far more (sharpened), all positions verified."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, GAMMA, generator=generator)
    survive = torch.rand(rows, GAMMA, generator=generator) < torch.sigmoid(logits)
    accepted = survive.long().cumprod(dim=1).sum(dim=1)
    window.observe(logits, torch.full((rows,), GAMMA), accepted, probe=True)


def test_auto_refit_only_when_switched_on_enough_rows_and_ece_above_the_threshold(state):
    state.store.update({"sts_temperatures": [0.25] * GAMMA})
    serve_overconfident_rounds(state.calibration, 400)
    report = state.calibration.report(torch.tensor([0.25] * GAMMA))
    assert report["probe_samples"] == report["samples"] == 400 and max(report["ece"]) > 0.1
    assert not refit.maybe_auto_refit(state, report, state.store.planner.state)  # off by default
    assert not refit.maybe_auto_refit(state, report, VerifySettings(auto_refit_ece=0.99))  # ECE below the threshold
    assert not refit.maybe_auto_refit(state, report, VerifySettings(auto_refit_ece=0.05))  # 400 < 512 rows
    before = state.store.version
    assert refit.maybe_auto_refit(state, report, VerifySettings(auto_refit_ece=0.05, auto_refit_min_samples=400))
    change = state.store.history[-1]
    assert state.store.version == before + 1 and change.caller == refit.AUTO_REFIT_CALLER
    fitted = torch.tensor(change.state.sts_temperatures)
    assert len(fitted) == GAMMA and (fitted > 0.25).all()  # the sharpened temperatures were flattened back
    after = state.calibration.report(fitted)
    assert max(after["ece"]) < max(report["ece"]) / 2
    assert state.store.update({"rollback_to": "previous"})["state"]["sts_temperatures"] == [0.25] * GAMMA


def test_sps_refit_writes_the_measured_table_and_sets_it_as_a_new_version(state):
    for _ in range(10):
        state.clock.costs.add(3, 0.05)  # 5x the table's 10 ms: the whole round, drafting included
    update = refit.with_refit(state, {"refit_sps": {"min_samples": 10}, "caller": "ops"})
    path = Path(update["set"]["sps_table"])
    assert update == {"set": {"sps_table": str(path)}, "caller": "ops"}
    assert path.parent == Path(state.store.planner.state.sps_table).parent / "cache" / "sps" / "refit"
    fitted = json.loads(path.read_text())
    assert fitted["sample_steps_per_sec"] == pytest.approx([20.0, 16.0, 8.0])  # measured bin, then scaled 5x
    outcome = state.store.update(update)
    assert outcome["state"]["sps_table"] == str(path) and state.store.planner.policy.sps.sample_steps_per_sec[0] == 20.0
    assert refit.with_refit(state, {"refit_sps": {"min_samples": 10}}) == {"set": {"sps_table": str(path)}}  # same name


@pytest.mark.parametrize("update, message", [
    ({"refit_sts": {"min_samples": 1}, "set": {"policy": "fixed"}}, "takes one of"),
    ({"refit_sts": {}, "refit_sps": {}}, "takes one of"),
    ({"refit_sps": {"min_sample": 3}}, 'refit_sps takes {"min_samples": N}'),
    ({"refit_sts": {"min_samples": "many"}}, "refit_sts.min_samples must be an integer"),
    ({"refit_sts": {"min_samples": 5}}, "window holds 0 labelled request-rounds; the refit needs at least 5"),
    ({"refit_sps": {"min_samples": 5}}, "round-cost window holds 0 rounds; the SPS refit needs at least 5"),
])
def test_malformed_or_premature_refits_name_the_problem(state, update, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        refit.with_refit(state, update)


def test_sps_refit_needs_a_table_to_refit(state):
    state.store.update({"policy": "sglang"})
    with pytest.raises(ConfigError, match="no SPS table to refit"):
        refit.with_refit(state, {"refit_sps": {"min_samples": 1}})


@pytest.mark.parametrize("kind, value, bound", [
    ("refit_sts", 0, LIVE_WINDOW_ROWS), ("refit_sts", -5, LIVE_WINDOW_ROWS),
    ("refit_sts", LIVE_WINDOW_ROWS + 1, LIVE_WINDOW_ROWS), ("refit_sps", -1, 2048), ("refit_sps", 2049, 2048),
])
def test_sample_counts_outside_one_to_the_window_are_refused(state, kind, value, bound):
    with pytest.raises(ConfigError, match=rf"{kind}.min_samples must be an integer in 1..{bound} .*got {value}$"):
        refit.with_refit(state, {kind: {"min_samples": value}})


def test_sps_refit_writes_where_dspark_sps_dir_says(state, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_SPS_DIR", str(tmp_path / "tables"))
    for _ in range(10):
        state.clock.costs.add(3, 0.05)
    update = refit.with_refit(state, {"refit_sps": {"min_samples": 10}})
    assert Path(update["set"]["sps_table"]).parent == tmp_path / "tables" / "refit"
    assert state.store.update(update)["applied"]  # and the scheduler accepts it from there
