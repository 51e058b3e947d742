"""Which served rounds are calibration probes: spread evenly at the live ratio."""
from dspark.integration.round_sampler import RoundSampler


def test_the_sampler_spreads_rounds_evenly_at_the_live_ratio():
    sampler = RoundSampler()
    assert [sampler.take(0.25) for _ in range(8)] == [False, False, False, True] * 2
    assert all(sampler.take(1.0) for _ in range(3)) and not any(sampler.take(0.0) for _ in range(3))
