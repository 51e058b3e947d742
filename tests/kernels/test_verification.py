"""kernels/verification.py: the emitted tokens follow the target's warped distribution exactly (chi-square)."""
import pytest
import torch
from scipy.stats import chisquare

from dspark.kernels import warping
from dspark.kernels.verification import prefix_length, verify_greedy, verify_sampled
from dspark.kernels.warping import filter_logits
from dspark.kernels.warping import SamplingParams

N = 40_000
P_MIN = 1e-3


def emitted_histogram(target_logits, draft_logits, params, lengths_value, seed):
    """Run one verification over N identical rows; histogram of the token emitted at each position 1..k+1."""
    vocab = target_logits.shape[-1]
    K = draft_logits.shape[0]
    gen = torch.Generator().manual_seed(seed)
    p = warping.probs(target_logits, params).expand(N, K + 1, vocab)
    q = warping.probs(draft_logits, params).expand(N, K, vocab)
    drafts = torch.stack([torch.multinomial(q[:, k], 1, generator=gen).squeeze(1) for k in range(K)], dim=1)
    lengths = torch.full((N,), lengths_value, dtype=torch.long)
    verdict = verify_sampled(p.contiguous(), q.contiguous(), drafts, lengths, gen)
    # Position i (0-based) is emitted when the first i drafts were accepted: draft i if accepted, else next_token.
    counts = []
    for i in range(lengths_value + 1):
        reached = verdict.accepted >= i
        token = torch.where(verdict.accepted > i, drafts[:, min(i, K - 1)], verdict.next_token)
        counts.append(torch.bincount(token[reached], minlength=vocab).double())
    return p[0], counts


def assert_follows(counts, probs):
    expected = probs.double() / probs.double().sum() * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    assert chisquare(counts[support], expected[support]).pvalue > P_MIN


# The target's distributions at positions 1..3 (independent of the drafts: a synthetic chain).
TARGET = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0],
                       [0.0, 2.5, 0.0, 1.0, -float("inf"), 0.5],
                       [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
# Draft 1 puts most mass on token 5, which the target rarely emits; draft 2 on token 4, which it never emits.
DRAFT = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 2.5],
                      [0.5, 0.0, 0.0, 0.0, 3.0, 0.0]])


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=4), SamplingParams(1.3, top_p=0.8),
                                    SamplingParams(1.0, top_k=3, top_p=0.9)])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_every_emitted_position_has_the_target_distribution(params, k):
    p, counts = emitted_histogram(TARGET, DRAFT, params, k, seed=11 + k)
    for i, c in enumerate(counts):
        assert c.sum() > 300, f"too few rounds reach position {i + 1} to test it"
        assert_follows(c, p[i])


def test_identical_distributions_accept_everything():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 3, 10, generator=gen), dim=-1)
    drafts = torch.stack([torch.multinomial(p[:, k], 1, generator=gen).squeeze(1) for k in range(2)], dim=1)
    verdict = verify_sampled(p, p[:, :2], drafts, torch.full((64,), 2), gen)
    assert (verdict.accepted == 2).all()


def test_draft_outside_target_support_is_always_rejected():
    p = torch.tensor([[[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]]).expand(100, 2, 3).contiguous()
    q = torch.tensor([[[0.0, 0.0, 1.0]]]).expand(100, 1, 3).contiguous()
    verdict = verify_sampled(p, q, torch.full((100, 1), 2), torch.ones(100, dtype=torch.long))
    assert (verdict.accepted == 0).all() and (verdict.next_token != 2).all()


def test_greedy_rule_accepts_the_matching_prefix_and_returns_the_target_argmax():
    logits = torch.full((3, 4, 9), -1.0)
    argmax = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]])
    logits.scatter_(2, argmax.unsqueeze(2), 5.0)
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3], [5, 6, 7]])
    verdict = verify_greedy(logits, drafts, torch.tensor([3, 3, 1]))
    assert verdict.accepted.tolist() == [2, 3, 1]  # row 2 verifies only d_1
    assert verdict.next_token.tolist() == [3, 4, 6]


def test_prefix_length_stops_at_the_first_rejection_and_the_request_length():
    accept = torch.tensor([[True, False, True], [True, True, True], [True, True, True]])
    assert prefix_length(accept, torch.tensor([3, 3, 2])).tolist() == [1, 3, 2]


@pytest.mark.parametrize("params", [SamplingParams(0.8, top_k=2), SamplingParams(1.0, top_p=0.5)])
def test_warping_keeps_the_top_tokens_and_renormalises(params):
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    probs = warping.probs(logits, params)[0]
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    kept = (probs > 0).nonzero().flatten().tolist()
    assert kept == ([0, 1] if params.top_k == 2 else [0])


def test_empty_blocks_sample_the_bonus_from_the_target():
    p = torch.tensor([[[0.0, 1.0, 0.0]]]).expand(5, 1, 3).contiguous()
    verdict = verify_sampled(p, torch.zeros(5, 0, 3), torch.zeros(5, 0, dtype=torch.long), torch.zeros(5, dtype=torch.long))
    assert verdict.accepted.tolist() == [0] * 5 and verdict.next_token.tolist() == [1] * 5


def test_filter_logits_top_k_and_top_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = lambda out: torch.isfinite(out).int().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2, top_p=1.0)) == [[1, 1, 0, 0]]
    assert kept(filter_logits(logits, top_k=0, top_p=0.8)) == [[1, 1, 0, 0]]  # .5+.3 reaches .8
    assert kept(filter_logits(logits, top_k=0, top_p=0.81)) == [[1, 1, 1, 0]]
    assert kept(filter_logits(logits, top_k=0, top_p=0.4)) == [[1, 0, 0, 0]]
