"""scripts/scaling_plot.py, the scaling curve's fit: each position's acceptance against log10(tokens) over the sizes
where it was measured, the tokens where it reaches the needed acceptance, and the other runs listed beside."""
import json
import math
import subprocess
import sys

import pytest

from tests.paths import REPO


def write_eval(directory, name, acceptance, reached=None, tau=1.5):
    reached = reached or [0 if math.isnan(a) else 100 for a in acceptance]
    (directory / f"{name}.json").write_text(json.dumps(
        {"datasets": {"mt-bench": {"tau": tau, "conditional_acceptance": acceptance, "reached_by_position": reached}}}))


def run_plot(directory, *tokens):
    subprocess.run([sys.executable, str(REPO / "scripts" / "scaling_plot.py"), "--results", str(directory),
                    "--tokens", *map(str, tokens), "--needed-acceptance", "0.54"], check=True, capture_output=True)
    return json.loads((directory / "scaling.json").read_text())


def test_each_position_is_fitted_over_its_measured_sizes_and_the_largest_need_is_reported(tmp_path):
    nan = float("nan")
    # position 1 rises 0.1 per decade: 0.2 at 1e4 tokens, so 0.54 at 10^(4 + 3.4); position 2 rises 0.2 per decade
    # from 0.3 at 1e5 (unmeasured at 1e4): 0.54 at 10^(5 + 1.2); position 3 never rises
    write_eval(tmp_path, "dspark-10000", [0.2, nan, 0.1], tau=1.1)
    write_eval(tmp_path, "dspark-100000", [0.3, 0.3, 0.1], tau=1.3)
    write_eval(tmp_path, "dspark-1000000", [0.4, 0.5, 0.05], tau=1.6)
    write_eval(tmp_path, "eagle3-10000", [0.25, 0.1, 0.0], tau=1.2)
    (tmp_path / "eagle3-10000.train_log.json").write_text(json.dumps(
        {"job": {"steps": 7, "wall_s": 60.0, "trained_tokens": 10001, "held_out": {"tau": 1.2}}}))
    summary = run_plot(tmp_path, 10000, 100000, 1000000)
    first, second, third = summary["fit"]
    assert first["slope_per_decade"] == pytest.approx(0.1) and first["points"] == 3
    assert math.log10(first["tokens_for_needed"]) == pytest.approx(7.4)
    assert second["points"] == 2 and math.log10(second["tokens_for_needed"]) == pytest.approx(6.2)
    assert third["tokens_for_needed"] is None, "a position that does not rise never gets there"
    assert summary["tokens_for_1_5x"] == pytest.approx(first["tokens_for_needed"])
    assert summary["positions_fitted"] == [1, 2]
    (other,) = summary["others"]
    assert other["run"] == "eagle3-10000" and other["steps"] == 7 and other["held_out_tau"] == 1.2
    assert summary["tau_by_drafter"] == {"dspark": [{"tokens": 10000, "tau": 1.1}, {"tokens": 100000, "tau": 1.3},
                                                    {"tokens": 1000000, "tau": 1.6}],
                                         "dflash": [], "eagle3": [{"tokens": 10000, "tau": 1.2}]}
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_a_size_where_few_rounds_reached_a_position_weighs_little(tmp_path):
    # 0.2 per decade over the sizes measured on 1000 rounds each; the smallest size's 0.15 rests on 2 rounds (an
    # unweighted fit: 0.125 per decade)
    write_eval(tmp_path, "dspark-10000", [0.15], reached=[2])
    write_eval(tmp_path, "dspark-100000", [0.2], reached=[1000])
    write_eval(tmp_path, "dspark-1000000", [0.4], reached=[1000])
    (position,) = run_plot(tmp_path, 10000, 100000, 1000000)["fit"]
    assert position["points"] == 3 and position["slope_per_decade"] == pytest.approx(0.2, abs=0.002)
    assert math.log10(position["tokens_for_needed"]) == pytest.approx(6.7, abs=0.02)
