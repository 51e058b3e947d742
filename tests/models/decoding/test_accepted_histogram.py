"""The accepted-length histogram (models/evaluation/acceptance.py): hand-built rounds, and the engine's rounds."""
import pytest

from dspark.models.decoding.engine import Generation, GenerationConfig, Round, SpeculativeDecoder
from dspark.models.evaluation.acceptance import accepted_histogram, acceptance_summary


def test_rounds_are_counted_by_drafts_accepted():
    rounds = [Round(4, 0, 1, None), Round(4, 2, 3, None), Round(2, 2, 3, None), Round(4, 4, 2, None),
              Round(0, 0, 1, None)]  # the last: a plain round (drafting skipped); the fourth cut by EOS
    assert accepted_histogram(rounds, gamma=4) == [2, 0, 2, 0, 1]
    summary = acceptance_summary([Generation([1], token_ids=[0] * 11, rounds=rounds)], gamma=4)
    assert summary["accepted_histogram"] == [2, 0, 2, 0, 1] and summary["accepted_drafts"] == 8
    # draft k verified with the earlier ones accepted: the rounds behind each conditional rate
    assert summary["reached_by_position"] == [4, 3, 2, 1]
    assert summary["conditional_acceptance"] == [3 / 4, 3 / 3, 1 / 2, 1 / 1]


def test_a_gamma_too_small_for_the_rounds_is_refused():
    with pytest.raises(ValueError, match="accepted 3 drafts, outside 0..gamma=2"):
        accepted_histogram([Round(3, 3, 4, None)], gamma=2)


def test_engine_rounds_sum_to_the_forwards_and_weigh_to_the_committed_tokens(embedded_target, embedded_drafters,
                                                                             prompts):
    drafter = embedded_drafters["dspark"]
    trace = []
    outputs = SpeculativeDecoder(embedded_target, drafter).generate(prompts[:3], GenerationConfig(12), trace=trace)
    histogram = acceptance_summary(outputs, drafter.config.gamma)["accepted_histogram"]
    request_rounds = sum(r.requests for r in trace)  # the engine's own count, from its batch rounds
    assert sum(histogram) == request_rounds == sum(g.target_forwards - 1 for g in outputs)
    assert sum(n * c for n, c in enumerate(histogram)) + request_rounds == sum(r.committed for r in trace)
