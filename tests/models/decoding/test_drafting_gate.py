"""Drafting switched off when it cannot pay (drafting_gate.py): the gate's choices, and decoding that stays
lossless, with the drafter's pending context carried across plain rounds, whatever the gate decides."""
import itertools
import re

import pytest
import torch

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding import drafting_gate
from dspark.models.decoding.drafting_gate import (MAX_REPROBE_EVERY, OUTLIER_ROUND, PLAIN_PROBE_REQUESTS,
                                                  PROBE_COST, REPROBE_EVERY, SPEC_PROBE_REQUESTS, WINDOW_REQUESTS,
                                                  DraftingGate, Measured, rounds_for)
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder, append_ragged
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError
from dspark.models.evaluation.run import warm_up
from tests.models.decoding.conftest import KINDS
from tests.models.decoding.test_engine_greedy import MAX_NEW, references  # noqa: F401  (the fixture)
from tests.models.decoding.test_engine_sampling import (LENGTH, P_MIN, SAMPLES, same_distribution_pvalue,
                                                        target_samples)

PATTERN = (False, False, True, False, True, True, False)  # plain, plain, draft, ...: scripted, not timed


def choices(gate: DraftingGate, rounds: int, spec=(0.10, 2.0), plain=(0.04, 1.0), batch_size=1) -> list[bool]:
    """The gate's decisions over `rounds` rounds whose (seconds, tokens per request) are fixed by kind."""
    made = []
    for _ in range(rounds):
        drafted = gate.drafts(batch_size)
        gate.observe(batch_size, drafted, *(spec if drafted else plain))
        made.append(drafted)
    return made


def probe_pattern(winner: bool, intervals) -> list[bool]:
    """`winner` every round but the last of each interval, which starts a re-probe burst of the loser (at batch 1:
    SPEC_PROBE_REQUESTS speculative rounds, PLAIN_PROBE_REQUESTS plain ones)."""
    burst = PLAIN_PROBE_REQUESTS if winner else SPEC_PROBE_REQUESTS
    made = []
    for n in intervals:
        made += [winner] * (n - 1) + [not winner] * burst
    return made


def test_the_gate_explores_both_then_drafts_only_while_speculation_is_faster():
    # 2 tokens / 100 ms = 20 tok/s against 1 token / 45 ms = 22.2 tok/s: plain wins; drafting is re-probed (a burst
    # of SPEC_PROBE_REQUESTS rounds at batch 1) after REPROBE_EVERY rounds, then after twice as many each time it
    # still loses, and from the third re-probe on at least as far apart as keeps re-probing at PROBE_COST of the
    # time: a burst wastes 1 - 20/22.2 of its 8 * 100 ms, 80 ms, which is 2% of 88.9 plain rounds of 45 ms
    plain = (0.045, 1.0)
    stretched = 0.1 * SPEC_PROBE_REQUESTS * 0.10 / (PROBE_COST * 0.045)
    assert stretched == pytest.approx(88.9, abs=0.05)
    intervals = [REPROBE_EVERY, 2 * REPROBE_EVERY, 89, 128, 256, 512, MAX_REPROBE_EVERY, MAX_REPROBE_EVERY]
    explore = [True] * SPEC_PROBE_REQUESTS + [False] * PLAIN_PROBE_REQUESTS
    pattern = probe_pattern(False, intervals)
    made = choices(DraftingGate("auto"), len(explore) + len(pattern), plain=plain)
    assert made == explore + pattern
    # 4 tokens / 100 ms = 40 tok/s: drafting wins, and plain decoding is re-measured the same way, by a shorter
    # burst (a plain round always commits one token)
    pattern = probe_pattern(True, [REPROBE_EVERY, 2 * REPROBE_EVERY])
    made = choices(DraftingGate("auto"), len(explore) + len(pattern), spec=(0.10, 4.0))
    assert made == explore + pattern
    assert all(choices(DraftingGate("always"), 20)) and not any(choices(DraftingGate("never"), 20))


def test_a_drafter_that_loses_by_far_costs_at_most_the_probe_budget_once_its_verdict_has_held():
    # a drafting round of 130 ms for 1 token against plain rounds of 45 ms: after two confirming re-probes the gate
    # waits 8 * (130 - 45) / (PROBE_COST * 45) = 755.6 rounds, so that the re-probes' wasted time stays within the
    # budget of the time spent
    gate, plain, explore = DraftingGate("auto"), (0.045, 1.0), SPEC_PROBE_REQUESTS + PLAIN_PROBE_REQUESTS
    intervals = [REPROBE_EVERY, 2 * REPROBE_EVERY, 756, 756]
    made = choices(gate, explore + len(probe_pattern(False, intervals)), spec=(0.13, 1.0), plain=plain)
    assert made[explore:] == probe_pattern(False, intervals)
    later = made[explore + len(probe_pattern(False, intervals[:2])):]
    wasted, spent = sum(later) * (0.13 - 0.045), sum(0.13 if d else 0.045 for d in later)
    assert 0.9 * PROBE_COST * spent < wasted <= PROBE_COST * spent
    # a drafting round of 300 ms would need 2600 rounds between re-probes: the wait stops at MAX_REPROBE_EVERY
    intervals = [REPROBE_EVERY, 2 * REPROBE_EVERY, MAX_REPROBE_EVERY, MAX_REPROBE_EVERY]
    made = choices(DraftingGate("auto"), explore + len(probe_pattern(False, intervals)), spec=(0.30, 1.0))
    assert made[explore:] == probe_pattern(False, intervals)


def test_rounds_timed_at_zero_seconds_do_not_break_the_gate():
    # a clock too coarse for a fast round reads 0 s: the gate keeps deciding, and waits the longest to re-probe
    intervals = [REPROBE_EVERY, 2 * REPROBE_EVERY, MAX_REPROBE_EVERY]
    explore = SPEC_PROBE_REQUESTS + PLAIN_PROBE_REQUESTS
    made = choices(DraftingGate("auto"), explore + len(probe_pattern(False, intervals)), spec=(0.05, 1.0),
                   plain=(0.0, 1.0))
    assert made[explore:] == probe_pattern(False, intervals)


def test_a_stalled_round_does_not_decide_the_verdict():
    # exploration measures 8 drafting rounds of 100 ms for 1.5 tokens (15 tok/s) and 4 plain rounds of 45 ms
    # (22.2 tok/s), one of which the machine stalled for half a second. At full length that round would put plain
    # decoding at 6.3 tok/s and switch drafting on until plain decoding's window filled with newer rounds; clipped
    # to OUTLIER_ROUND times the window's median round, plain decoding measures 17.8 tok/s and still wins
    gate = DraftingGate("auto")
    for _ in range(SPEC_PROBE_REQUESTS):
        assert gate.drafts(1)
        gate.observe(1, True, 0.10, 1.5)
    for seconds in (0.5, 0.045, 0.045, 0.045):
        assert not gate.drafts(1)
        gate.observe(1, False, seconds, 1.0)
    assert gate.sizes[1].plain.rate() == pytest.approx(4 / ((OUTLIER_ROUND + 3) * 0.045))
    assert not any(choices(gate, REPROBE_EVERY - 1, spec=(0.10, 1.5), plain=(0.045, 1.0)))


def test_a_drafting_rounds_honest_variation_is_not_clipped():
    # rounds verifying few drafts (80 ms, 1 token) and many (150 ms, 4 tokens): all of their time counts
    spec = Measured()
    for seconds, tokens in [(0.08, 1.0), (0.15, 4.0)] * 4:
        spec.add(seconds, tokens, batch_size=1)
    assert spec.rate() == pytest.approx(20 / 0.92)


def test_a_winning_drafters_plain_re_probes_stretch_only_as_far_as_their_cost():
    # drafting 4 tokens / 100 ms = 40 tok/s against 25: a burst of PLAIN_PROBE_REQUESTS plain rounds of 40 ms wastes
    # 1 - 25/40 of them, 60 ms, 2% of 30 drafting rounds: doubling's 64, 128, ... is longer, and stands
    intervals = [REPROBE_EVERY * 2 ** i for i in range(5)]
    explore = SPEC_PROBE_REQUESTS + PLAIN_PROBE_REQUESTS
    made = choices(DraftingGate("auto"), explore + len(probe_pattern(True, intervals)), spec=(0.10, 4.0))
    assert made[explore:] == probe_pattern(True, intervals)


def test_a_changed_verdict_restarts_the_probe_interval():
    gate = DraftingGate("auto")
    choices(gate, SPEC_PROBE_REQUESTS + PLAIN_PROBE_REQUESTS + REPROBE_EVERY + 2 * REPROBE_EVERY
            + 2 * (SPEC_PROBE_REQUESTS - 1))
    assert gate.probe_every == 4 * REPROBE_EVERY and gate.verdict is False  # plain wins, re-probed twice
    # drafting turns out far faster at the next re-probe, which the cost of re-probing has stretched to 200 rounds
    choices(gate, 200 + SPEC_PROBE_REQUESTS, spec=(0.01, 4.0))
    assert gate.verdict and gate.probe_every <= 2 * REPROBE_EVERY


def test_batch_sizes_keep_their_own_measurements_and_a_new_one_follows_the_nearest():
    gate = DraftingGate("auto")
    choices(gate, SPEC_PROBE_REQUESTS + PLAIN_PROBE_REQUESTS + 1, batch_size=1)  # at 1: plain wins (25 against 20 tok/s)
    # at 8 drafting would win, but 8 is unmeasured: it follows 1 (plain) until its re-probe measures drafting
    made = choices(gate, REPROBE_EVERY + 2, spec=(0.10, 4.0), batch_size=8)
    assert not made[0] and gate.sizes[8].known(8)
    assert made[-3:] == [True] * 3  # once both sides are measured at 8, 8 drafts
    assert choices(gate, 3, batch_size=1) == [False] * 3  # and size 1 kept its own verdict
    assert choices(gate, 3, batch_size=7) == [True] * 3  # 7 follows its nearest measured size, 8


@pytest.mark.parametrize("batch_size, bad_rounds_to_stop", [(8, 1), (1, 5)])
def test_a_bad_round_weighs_by_the_requests_it_averages(batch_size, bad_rounds_to_stop):
    # drafting wins (3 tokens / 100 ms = 30 tok/s against 25); then speculative rounds commit 1.25 tokens per
    # request. At batch 8 a round averages 8 requests and the window holds 2 rounds: one bad round stops drafting.
    # At batch 1 the window holds 16 rounds of one request each: it takes 5 bad ones.
    gate = DraftingGate("auto")
    choices(gate, SPEC_PROBE_REQUESTS + PLAIN_PROBE_REQUESTS + 16, spec=(0.10, 3.0), batch_size=batch_size)
    assert gate.verdict is True
    gate.since_probe = gate.probing = 0  # no re-probe of plain decoding among the rounds below
    for _ in range(bad_rounds_to_stop):
        assert gate.drafts(batch_size)
        gate.observe(batch_size, True, 0.10, 1.25)
    assert gate.drafts(batch_size) is False
    assert len(gate.sizes[batch_size].spec.rounds) == rounds_for(WINDOW_REQUESTS, batch_size)


def test_a_noisy_drafter_that_pays_on_average_keeps_drafting_at_batch_1():
    # one request's rounds commit 1 token 60% of the time and 2.25 otherwise: 1.5 tokens in 60 ms (25 tok/s)
    # against plain rounds of 1 token in 48 ms (20.8 tok/s). The gate must draft most rounds.
    gate, tokens = DraftingGate("auto"), itertools.cycle([1, 2.25, 1, 1, 2.25])
    made = []
    for _ in range(300):
        drafted = gate.drafts(1)
        gate.observe(1, drafted, 0.060 if drafted else 0.048, next(tokens) if drafted else 1.0)
        made.append(drafted)
    assert sum(made) > 0.9 * len(made)


def test_an_unknown_mode_is_refused_by_name(embedded_target):
    with pytest.raises(ConfigError, match=re.escape("drafting must be one of auto|always|never, got 'sometimes'")):
        SpeculativeDecoder(embedded_target, drafting="sometimes")


def test_append_ragged_puts_each_rows_new_positions_right_after_its_old_ones():
    first = (torch.arange(6.).reshape(2, 3, 1), torch.tensor([[1, 2, 0], [4, 5, 6]]), torch.tensor([2, 3]))
    second = (torch.tensor([[[10.], [11.]], [[12.], [13.]]]), torch.tensor([[7, 8], [9, 0]]), torch.tensor([2, 1]))
    features, tokens, lengths = append_ragged(first, second)
    assert lengths.tolist() == [4, 4]
    assert tokens.tolist() == [[1, 2, 7, 8], [4, 5, 6, 9]]
    assert features.squeeze(2).tolist() == [[0., 1., 10., 11.], [3., 4., 5., 12.]]


@pytest.fixture
def scripted(monkeypatch):
    """Drafting decided by a pattern instead of wall-clock time (default PATTERN)."""
    def script(pattern=PATTERN):
        rounds = itertools.cycle(pattern)
        monkeypatch.setattr(drafting_gate.DraftingGate, "drafts", lambda self, batch_size: next(rounds))
    return script


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("max_running", [1, 3])
def test_greedy_stays_identical_with_drafting_switched_on_and_off(kind, max_running, scripted, embedded_target,
                                                                   embedded_drafters, prompts, references):  # noqa: F811
    scripted()
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters[kind], drafting="auto")
    outputs = decoder.generate(prompts, GenerationConfig(max_new_tokens=MAX_NEW), max_running=max_running)
    assert [g.token_ids for g in outputs] == references
    rounds = [r for g in outputs for r in g.rounds]
    plain = [r for r in rounds if r.confidence_logits is None and r.verify_len == 0]
    assert plain and all(r.emitted == 1 for r in plain)
    # the drafter still lands drafts after catching up on the positions it skipped
    assert max(r.accepted for r in rounds) >= 2


def test_sampling_keeps_the_targets_distribution_with_drafting_switched_on_and_off(scripted, embedded_target,
                                                                                  embedded_drafters, prompts):
    scripted((False, True))  # a plain round, then a draft on the context it left pending
    params, prompt = SamplingParams(1.0), prompts[1]
    reference = target_samples(embedded_target, prompt, params, seed=1)
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters["dspark"], VerifyLengthPolicy.of("fixed"),
                                 drafting="auto")
    generator, outputs = torch.Generator().manual_seed(2), []
    for _ in range(SAMPLES // 1000):
        # two tokens more, so that the drafting round has budget left to verify drafts in
        outputs += decoder.generate([prompt] * 1000, GenerationConfig(max_new_tokens=LENGTH + 2, sampling=params),
                                    generator)
    speculative = torch.tensor([g.token_ids[:LENGTH] for g in outputs])
    assert all([r.verify_len == 0 for r in g.rounds[:1]] == [True] for g in outputs)
    assert sum(r.accepted for g in outputs for r in g.rounds) > SAMPLES // 10
    for position in range(LENGTH):
        assert same_distribution_pvalue(reference[:, position], speculative[:, position]) > P_MIN, position


def test_a_warm_up_leaves_the_gate_with_both_kinds_of_round_measured_at_its_batch_size(embedded_target,
                                                                                       embedded_drafters, prompts):
    # benchmarks warm each decoder up untimed (evaluation.run.warm_up): the timed run starts from a gate that
    # already knows both sides at that batch size instead of paying its exploration rounds
    decoder = SpeculativeDecoder(embedded_target, embedded_drafters["dspark"], drafting="auto")
    warm_up([decoder], prompts[:2], GenerationConfig(max_new_tokens=64))
    assert decoder.gate.sizes[2].known(2)
