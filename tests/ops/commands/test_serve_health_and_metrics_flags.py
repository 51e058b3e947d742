"""`dspark serve --dry-run`: metrics on unless --no-metrics, and the liveness window and step bound handed to
SGLang's HTTP process from their one definition (integration/liveness.py)."""
import json

import pytest

from dspark.integration.liveness import Liveness
from dspark.ops.cli import main

from tests.ops.commands.test_serve_command import BASE, dry_run
from tests.paths import EMBEDDED

DRAFTER = ["--drafter", str(EMBEDDED / "dspark")]


def test_metrics_are_on_by_default_and_off_with_no_metrics(capsys):
    assert "--enable-metrics" in dry_run(capsys, *DRAFTER)[1]
    assert "--enable-metrics" not in dry_run(capsys, *DRAFTER, "--no-metrics")[1]


def test_the_liveness_window_and_step_bound_reach_sglang_with_their_defaults_or_the_flags(capsys):
    assert json.loads(dry_run(capsys, *DRAFTER)[0][Liveness.ENV_VAR]) == {"liveness_window": 300.0,
                                                                          "liveness_step_bound": 60.0}
    handed = json.loads(dry_run(capsys, *DRAFTER, "--liveness-window", "60", "--liveness-step-bound", "5")[0][
        Liveness.ENV_VAR])
    assert handed == {"liveness_window": 60, "liveness_step_bound": 5}


@pytest.mark.parametrize("flag, value, problem", [
    ("--liveness-window", "0.5", "liveness_window must be in [1.0, 86400.0], got 0.5"),
    ("--liveness-window", "100000", "liveness_window must be in [1.0, 86400.0], got 100000"),
    ("--liveness-step-bound", "0.5", "liveness_step_bound must be in [1.0, 86400.0], got 0.5")])
def test_a_liveness_bound_out_of_range_stops_serve_naming_it(capsys, flag, value, problem):
    assert main(BASE + DRAFTER + [flag, value]) == 2
    captured = capsys.readouterr()
    assert problem in captured.err and "sglang.launch_server" not in captured.out
