"""The canary's verdict over one window (ops/admin/drafter_rollout.py); the rollout itself runs on real replicas in
tests/integration/test_drafter_rollout.py."""
import pytest

from dspark.ops.admin.drafter_rollout import PROMOTE, ROLL_BACK, WATCH, side_tau, verdict


@pytest.mark.parametrize("canary, fleet, margin, expected", [
    (2.1, 2.0, 0.1, PROMOTE),      # better: promoted
    (2.0, 2.0, 0.1, WATCH),        # level: not yet shown better
    (1.95, 2.0, 0.1, WATCH),       # a little worse, within the margin: another window
    (1.89, 2.0, 0.1, ROLL_BACK),   # worse by more than the margin
    (1.0, 2.0, 0.0, ROLL_BACK),
    (None, 2.0, 0.1, WATCH),       # the canary served no verify forward in the window
    (2.5, None, 0.1, WATCH),       # nor did the fleet
])
def test_a_window_promotes_only_a_better_canary_and_rolls_back_one_worse_by_the_margin(canary, fleet, margin,
                                                                                       expected):
    assert verdict(canary, fleet, margin) == expected


def test_a_side_s_tau_is_the_mean_of_its_replicas_that_served():
    assert side_tau([2.0, None, 3.0, 1.0], [0, 1, 2]) == 2.5
    assert side_tau([2.0, None], [1]) is None
