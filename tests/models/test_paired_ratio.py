"""Ratios of runs that took turns (models/evaluation/paired.py): the one definition of 'x times no-spec'."""
import pytest

from dspark.models.evaluation.paired import format_ratio, paired_ratio


def test_a_ratio_pairs_each_run_with_the_baselines_run_of_the_same_turn():
    # the machine ran at full speed, half speed, then 0.8 in turns 1-3, and a burst of load hit only the
    # speculative run of turn 3: the paired median keeps the true 1.2x, a ratio of medians would say 0.75x
    baseline, runs = [10.0, 5.0, 8.0], [12.0, 6.0, 4.0]
    ratio, paired = paired_ratio(runs, baseline)
    assert paired == pytest.approx([1.2, 1.2, 0.5]) and ratio == pytest.approx(1.2)
    assert format_ratio(ratio, paired) == "1.20x (0.50-1.20)"
    assert format_ratio(*paired_ratio([9.0], [10.0])) == "0.90x"  # one run: no range to show


def test_runs_and_baseline_of_different_lengths_are_refused():
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
