"""Round costs measured online: the planner's overhead (the smallest recent round time - profiled verify time),
and the SPS table's distance from and refit to the measured round times."""
import pytest

from dspark.models.decoding.round_cost import MIN_PER_BIN, RoundClock, RoundCosts
from dspark.kernels.sps import SpsTable
from dspark.models.errors import ConfigError

TABLE = SpsTable((1, 8), (100.0, 50.0), 8)  # 10 ms up to 7 tokens, 20 ms from 8


def test_overhead_is_the_smallest_recent_excess_over_the_table():
    clock = RoundClock()
    assert clock.overhead() == 0.0  # nothing measured yet: plan on the table alone
    now = 0.0
    for tokens, seconds in [(4, 0.050), (8, 0.060), (8, 3.0), (1, 0.045)]:  # 3 s: an idle gap between bursts
        clock.observe(now, TABLE)
        clock.planned(now, tokens)
        now += seconds
    clock.observe(now, TABLE)
    # excesses: 0.050 - 0.010, 0.060 - 0.020, 3.0 - 0.020, 0.045 - 0.010
    assert clock.overhead() == pytest.approx(0.035)


def test_only_the_last_window_counts_and_reset_forgets():
    clock = RoundClock()
    now = 0.0
    for seconds in [0.011] + [0.030] * RoundClock.WINDOW:
        clock.observe(now, TABLE)
        clock.planned(now, 1)
        now += seconds
    clock.observe(now, TABLE)
    assert clock.overhead() == pytest.approx(0.020)  # the 1 ms sample has left the window
    clock.reset()
    clock.observe(now + 5.0, TABLE)
    assert clock.overhead() == 0.0


def test_the_clock_records_every_interval_as_a_round_cost_and_keeps_them_across_a_reset():
    clock = RoundClock()
    for now, tokens in [(0.0, 4), (0.05, 8), (0.11, 1)]:
        clock.observe(now, TABLE)
        clock.planned(now, tokens)
    assert list(clock.costs.samples) == [(4, pytest.approx(0.05)), (8, pytest.approx(0.06))]
    clock.reset()  # a new table: the overhead samples go, the measured costs do not depend on it
    assert len(clock.costs.samples) == 2 and clock.overhead() == 0.0


def test_error_is_the_median_relative_miss_of_table_plus_overhead():
    costs = RoundCosts()
    assert costs.error(TABLE, 0.0) is None
    for tokens, seconds in [(4, 0.020), (4, 0.020), (8, 0.040)]:  # table: 10 ms, 10 ms, 20 ms
        costs.add(tokens, seconds)
    assert costs.error(TABLE, 0.0) == pytest.approx(0.5)
    assert costs.error(TABLE, 0.010) == pytest.approx(0.0)  # 10 ms overhead explains the two 4-token rounds


def test_fit_measures_the_bins_traffic_used_and_scales_the_others():
    table = SpsTable((1, 8, 32), (100.0, 50.0, 25.0), 64)  # 10, 20, 40 ms
    costs = RoundCosts()
    for _ in range(MIN_PER_BIN):
        costs.add(4, 0.030)  # bin 1..7: measured 30 ms (3x the table)
    costs.add(9, 0.060)  # bin 8..31: one sample, too few to measure it alone
    costs.add(2, 3.0)  # an idle gap: the median ignores it
    fitted = costs.fit(table, min_samples=5)
    assert fitted.sample_batch_tokens == table.sample_batch_tokens and fitted.max_batch_tokens == 64
    # bin 1 measured; bins 8 and 32 take the table's time scaled by the median ratio (3x)
    assert fitted.sample_steps_per_sec == pytest.approx((1 / 0.030, 1 / 0.060, 1 / 0.120))
    assert costs.error(fitted, 0.0) == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="holds 10 rounds; the SPS refit needs at least 11"):
        costs.fit(table, min_samples=11)

