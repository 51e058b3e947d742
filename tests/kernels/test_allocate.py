"""The verification-length allocator (kernels/allocate.py): hand-worked cases, the paper's Appendix A case,
causality as a property over random inputs, limits, ties and bad input."""
import pytest
import torch

from dspark.kernels.allocate import POLICIES, allocate_verify_lengths
from dspark.kernels.sps import SpsTable


def table(curve: dict[int, float], max_batch_tokens: int = 64) -> SpsTable:
    return SpsTable.from_probes(curve, max_batch_tokens)


def lengths(confidence, sps=None, policy="causal", **params) -> list[int]:
    return allocate_verify_lengths(torch.tensor(confidence, dtype=torch.float64), sps, policy, **params).tolist()


# a = [[0.9, 0.45], [0.8, 0.72]]: admission order (0,1) .9, (1,1) .8, (1,2) .72, (0,2) .45
TWO_REQUESTS = [[0.9, 0.5], [0.8, 0.9]]


def test_causal_admits_while_goodput_rises():
    # Theta: B=2 2.0 -> B=3 2.9*.9=2.61 -> B=4 3.7*.8=2.96 -> B=5 4.42*.6=2.652: stop before (1,2)
    sps = table({1: 1.0, 2: 1.0, 3: 0.9, 4: 0.8, 5: 0.6, 6: 0.5})
    assert lengths(TWO_REQUESTS, sps) == [1, 1]
    # a flatter curve at B=5 (4.42*.7=3.094) admits (1,2); B=6 (4.87*.5=2.435) stops
    assert lengths(TWO_REQUESTS, table({1: 1.0, 2: 1.0, 3: 0.9, 4: 0.8, 5: 0.7, 6: 0.5})) == [1, 2]


def test_causal_stops_at_a_cliff_that_the_global_search_crosses():
    # B=5: 4.42*.55=2.431 < 2.96 stops Algorithm 1; a full search finds B=6: 4.87*.75=3.65
    sps = table({1: 1.0, 2: 1.0, 3: 0.9, 4: 0.8, 5: 0.55, 6: 0.75})
    assert lengths(TWO_REQUESTS, sps) == [1, 1]
    assert lengths(TWO_REQUESTS, sps, "lagged", lagged_confidence=torch.tensor(TWO_REQUESTS)) == [2, 2]


@pytest.mark.parametrize("c2", [0.9, 0.0])
def test_appendix_a_causal_verifies_nothing_whatever_c2(c2):
    sps = table({1: 1.0, 2: 0.5, 3: 0.45})
    assert lengths([[0.8, c2]], sps) == [0]
    # the retrospective global search the appendix warns about would verify 2 drafts when c2 = 0.9
    retrospective = lengths([[0.8, c2]], sps, "lagged", lagged_confidence=torch.tensor([[0.8, c2]]))
    assert retrospective == ([2] if c2 == 0.9 else [0])


def test_lagged_takes_the_budget_from_old_confidences_and_the_slots_from_current_ones():
    flat = table({1: 1.0})  # every admission raises Theta: the budget is every old candidate with a > 0
    old = torch.tensor([[0.9, 0.9], [0.0, 0.0]])  # two candidates
    assert lengths([[0.1, 0.1], [0.9, 0.9]], flat, "lagged", lagged_confidence=old) == [0, 2]
    assert lengths([[0.9, 0.9], [0.95, 0.1]], flat, "lagged", lagged_confidence=old) == [1, 1]


def test_causal_skips_zero_survival_and_a_flat_table_verifies_the_rest():
    assert lengths([[0.5, 0.0, 0.7], [1.0, 1.0, 1.0]], table({1: 3.0})) == [1, 3]


def test_static_policies():
    c = [[0.9, 0.6, 0.9], [0.5, 0.99, 0.99]]  # survivals [.9, .54, .486], [.5, .495, .49]
    assert lengths(c, policy="threshold", threshold=0.5) == [2, 1]
    assert lengths(c, policy="threshold", threshold=0.5, threshold_on="confidence") == [3, 3]
    assert lengths(c, policy="threshold", threshold=0.95, threshold_on="confidence") == [0, 0]
    assert lengths(c, policy="fixed") == [3, 3]
    assert lengths(c, policy="fixed", max_length=2) == [2, 2]
    assert lengths(c, policy="mtp1") == [1, 1]


def test_limits_floor_cap_and_token_budget():
    c = [[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]
    assert lengths(c, policy="mtp1", min_length=2) == [2, 2]
    assert lengths(c, policy="fixed", max_length=torch.tensor([1, 3])) == [1, 3]
    assert lengths(c, policy="fixed", max_length=torch.tensor([1, 0]), min_length=2) == [1, 0]
    # 2 anchors + 3 drafts: the three highest survivals .9, .72, .6 win
    assert lengths(c, policy="fixed", max_batch_tokens=5) == [2, 1]
    # the SPS table's own max_batch_tokens caps the causal policy too
    assert lengths(c, table({1: 1.0}, max_batch_tokens=4)) == [2, 0]
    # floors are kept even past the token budget
    assert lengths(c, policy="mtp1", min_length=1, max_batch_tokens=3) == [1, 1]


def test_ties_are_deterministic_request_major():
    ones = [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    for policy in ("fixed", "causal"):
        assert lengths(ones, table({1: 1.0}), policy, max_batch_tokens=5) == [2, 0, 0]


def random_case(gen: torch.Generator):
    R, gamma = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 7, (1,), generator=gen))
    confidence = torch.rand(R, gamma, generator=gen, dtype=torch.float64)
    probes = sorted(set(torch.randint(1, 40, (6,), generator=gen).tolist()) | {1})
    sps = table({b: float(v) for b, v in zip(probes, 0.2 + torch.rand(len(probes), generator=gen))},
                max_batch_tokens=int(torch.randint(probes[-1], 48, (1,), generator=gen)))
    return confidence, sps


@pytest.mark.parametrize("policy", POLICIES)
def test_admitting_draft_k_never_depends_on_later_confidences(policy):
    """Non-anticipation (Appendix A): l_r >= k must not change when c_{r,k+1..gamma} change (x_{r,k} drives them)."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(600):
        confidence, sps = random_case(gen)
        R, gamma = confidence.shape
        params = dict(lagged_confidence=torch.rand(R, gamma, generator=gen, dtype=torch.float64),
                      threshold=0.3, min_length=int(torch.randint(0, 2, (1,), generator=gen)))
        before = allocate_verify_lengths(confidence, sps, policy, **params)
        r, k = int(torch.randint(0, R, (1,), generator=gen)), int(torch.randint(1, gamma + 1, (1,), generator=gen))
        changed = confidence.clone()  # later confidences at random, or at the extremes Appendix A uses
        changed[r, k:] = [torch.rand(gamma - k, generator=gen, dtype=torch.float64), 0.0, 1.0][_ % 3]
        after = allocate_verify_lengths(changed, sps, policy, **params)
        assert (before[r] >= k) == (after[r] >= k), (policy, confidence, changed, r, k)


def test_retrospective_search_is_not_causal():
    """The property test can fail: the full search on current confidences (lagged fed this round's) does."""
    sps = table({1: 1.0, 2: 0.5, 3: 0.45})
    high, low = torch.tensor([[0.8, 0.9]]), torch.tensor([[0.8, 0.0]])
    admits = [allocate_verify_lengths(c, sps, "lagged", lagged_confidence=c)[0] >= 1 for c in (high, low)]
    assert admits == [True, False]


def test_budget_and_results_stay_in_range():
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        confidence, sps = random_case(gen)
        for policy in ("causal", "lagged"):
            out = allocate_verify_lengths(confidence, sps, policy, lagged_confidence=confidence.flip(0))
            assert out.dtype == torch.long and ((out >= 0) & (out <= confidence.shape[1])).all()
            assert int((1 + out).sum()) <= max(sps.max_batch_tokens, confidence.shape[0])


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([[0.5, float("nan")]]), "NaN"),
    (torch.tensor([[0.5, 1.5]]), r"\[0, 1\]"),
    (torch.tensor([[-0.1, 0.5]]), r"\[0, 1\]"),
    (torch.tensor([0.5, 0.5]), r"\[requests, gamma\]"),
    (torch.tensor([[1, 0]]), "float tensor"),
])
def test_bad_confidences_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        allocate_verify_lengths(bad, table({1: 1.0}))


def test_bad_settings_are_named():
    c = torch.full((2, 3), 0.5)
    with pytest.raises(ValueError, match="gamma=3"):
        allocate_verify_lengths(c, table({1: 1.0}), "lagged", lagged_confidence=torch.full((2, 4), 0.5))
    with pytest.raises(ValueError, match="needs lagged_confidence"):
        allocate_verify_lengths(c, table({1: 1.0}), "lagged")
    with pytest.raises(ValueError, match="needs an SPS table"):
        allocate_verify_lengths(c, None, "causal")
    with pytest.raises(ValueError, match="unknown allocation policy 'greedy'"):
        allocate_verify_lengths(c, table({1: 1.0}), "greedy")
    with pytest.raises(ValueError, match="threshold in"):
        allocate_verify_lengths(c, policy="threshold")
    with pytest.raises(ValueError, match="threshold_on"):
        allocate_verify_lengths(c, policy="threshold", threshold=0.5, threshold_on="logit")
    with pytest.raises(ValueError, match="min_length"):
        allocate_verify_lengths(c, policy="fixed", min_length=-1)
