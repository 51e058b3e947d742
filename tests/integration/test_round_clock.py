"""The planner's online round overhead: the smallest recent (round time - profiled verify time)."""
import pytest

from dspark.integration.planner import RoundClock
from dspark.kernels.sps import SpsTable

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
