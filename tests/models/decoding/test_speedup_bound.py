"""The expected speedup of a chain drafter from measured costs (models/evaluation/speedup_bound.py)."""
import math

import pytest

from dspark.kernels.sps import SpsTable
from dspark.models.evaluation.speedup_bound import (ChainCosts, acceptance_for, best_verify_len, expected_speedup,
                                                    expected_tokens, speedup_curve, speedup_report)

# a verify forward of 1-2 tokens takes 40 ms, of 3-4 tokens 50 ms, of 5-8 tokens 80 ms
TABLE = SpsTable((1, 3, 5), (25.0, 20.0, 12.5), 8)
COSTS = ChainCosts(TABLE, plain_s=0.040, draft_s=0.010)


def test_expected_tokens_adds_the_survivals():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    with pytest.raises(ValueError, match="verify_len must be in 0..3"):
        expected_tokens([0.5, 0.5, 0.5], 4)


def test_a_round_costs_drafting_plus_a_plain_round_grown_as_the_forward_grows():
    assert COSTS.round_s(1) == pytest.approx(0.050)  # 2 tokens cost what 1 does
    assert COSTS.round_s(2) == pytest.approx(0.060)  # 3 tokens: 1.25x the forward
    assert expected_speedup([0.5] * 4, COSTS, 2) == pytest.approx(1.75 * 0.040 / 0.060)
    slower = ChainCosts(SpsTable((1, 3, 5), (12.5, 10.0, 6.25), 8), plain_s=0.040, draft_s=0.010)
    assert slower.round_s(2) == pytest.approx(COSTS.round_s(2))  # a profile from a slow minute: the same shape


def test_the_best_verify_length_stops_before_a_costly_step():
    # 4 drafts (5 tokens) make the forward 1.6x as long as 3 do: worth it only when the 4th is likely accepted
    assert best_verify_len([0.5] * 6, COSTS)[0] == 3
    assert best_verify_len([1.0] * 6, COSTS)[0] == 6
    k, speedup = best_verify_len([0.9, 0.0, 0.0], COSTS)
    assert (k, speedup) == (1, pytest.approx(1.9 * 0.040 / 0.050))


def test_the_acceptance_needed_reaches_the_speedup_asked():
    alpha = acceptance_for(1.5, COSTS, 6)
    assert best_verify_len([alpha] * 6, COSTS)[1] == pytest.approx(1.5)
    assert best_verify_len([alpha - 0.01] * 6, COSTS)[1] < 1.5
    assert acceptance_for(1.0, COSTS, 6) < alpha < acceptance_for(2.0, COSTS, 6)
    assert acceptance_for(8.0, COSTS, 6) is None  # 7 tokens a round at most: the costs forbid it


def test_the_curve_rises_with_acceptance():
    curve = speedup_curve(COSTS, 6, points=11)
    assert [a for a, _ in curve] == pytest.approx([i / 10 for i in range(11)])
    assert all(b[1] >= a[1] for a, b in zip(curve, curve[1:]))
    assert curve[-1][1] == pytest.approx(7 * 0.040 / COSTS.round_s(6))


def test_the_report_uses_the_positions_enough_rounds_reached():
    # position 3: 3 rounds (all accepted) are too few to count; position 4 is never reached
    report = speedup_report([0.6, 0.5, 1.0, math.nan], [40, 24, 3, 0], COSTS, 4)
    assert report["measured_acceptance"] == [0.6, 0.5]
    assert report["expected_speedup"] == pytest.approx(best_verify_len([0.6, 0.5], COSTS)[1])
    assert report["acceptance_needed"]["1.5x"] == pytest.approx(acceptance_for(1.5, COSTS, 4))
    nothing = speedup_report([math.nan] * 4, [0] * 4, COSTS, 4)
    assert nothing["best_verify_len"] == 0 and nothing["expected_speedup"] is None


@pytest.mark.parametrize("field, value", [("plain_s", 0.0), ("draft_s", -0.001), ("draft_s", math.inf)])
def test_bad_costs_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        ChainCosts(TABLE, **{"plain_s": 0.04, "draft_s": 0.01, field: value})
