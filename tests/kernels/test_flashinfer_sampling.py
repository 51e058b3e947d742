"""kernels/flashinfer_sampling.py: padding to gamma and capping the accepted count is lossless.

On CPU, FlashInfer's full-width chain output is produced by the reference verification at l = gamma on the
same uniforms (the format FlashInfer returns: accepted drafts, then the recovered / bonus token, then -1).
Capped at l_r it equals the reference run at l_r whenever the full run stopped first, and the token emitted at
every position follows the target's distribution (chi-square). The FlashInfer call itself runs on CUDA only.
"""
import pytest
import torch
from scipy.stats import chisquare

from dspark.kernels.flashinfer_sampling import cap_chain_output, verify_sampled_flashinfer
from dspark.kernels.verification import verify_sampled_torch

GAMMA, VOCAB = 3, 6


def flashinfer_format(full, drafts):
    """The reference's full-width verdict as FlashInfer's (output_token_ids [bs, gamma+1], emitted [bs])."""
    bs = drafts.shape[0]
    slots = torch.arange(GAMMA + 1)
    out = torch.cat([drafts, drafts[:, :1]], 1).clone()
    out[torch.arange(bs), full.accepted] = full.next_token
    return torch.where(slots <= full.accepted[:, None], out, torch.full_like(out, -1)), full.accepted


def chain_case(n, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(GAMMA + 1, VOCAB, generator=g), -1).expand(n, -1, -1).contiguous()
    q = torch.softmax(torch.randn(GAMMA, VOCAB, generator=g), -1).expand(n, -1, -1).contiguous()
    drafts = torch.stack([torch.multinomial(q[:, k], 1, generator=g).squeeze(1) for k in range(GAMMA)], 1)
    return p, q, drafts, torch.rand(n, GAMMA, generator=g), torch.rand(n, generator=g)


def test_capped_equals_the_reference_when_the_full_run_stopped_first():
    p, q, drafts, u, u_final = chain_case(4000, 0)
    lengths = torch.randint(0, GAMMA + 1, (4000,), generator=torch.Generator().manual_seed(1))
    full = verify_sampled_torch(target_probs=p, draft_probs=q, draft_tokens=drafts,
                                lengths=torch.full((4000,), GAMMA), uniforms=u, final_uniforms=u_final)
    capped = cap_chain_output(**dict(zip(("output_token_ids", "emitted"), flashinfer_format(full, drafts))),
                              lengths=lengths)
    direct = verify_sampled_torch(target_probs=p, draft_probs=q, draft_tokens=drafts, lengths=lengths, uniforms=u,
                                  final_uniforms=u_final)
    assert torch.equal(capped.accepted, torch.minimum(full.accepted, lengths))
    stopped_first = full.accepted < lengths
    assert stopped_first.any() and (~stopped_first).any()
    assert torch.equal(capped.next_token[stopped_first], direct.next_token[stopped_first])
    assert torch.equal(capped.accepted, direct.accepted)  # the same acceptance tests decide n


@pytest.mark.parametrize("length", [0, 1, 2])
def test_every_position_of_a_capped_chain_has_the_target_distribution(length):
    n = 30_000
    p, q, drafts, u, u_final = chain_case(n, 10 + length)
    full = verify_sampled_torch(target_probs=p, draft_probs=q, draft_tokens=drafts,
                                lengths=torch.full((n,), GAMMA), uniforms=u, final_uniforms=u_final)
    out, emitted = flashinfer_format(full, drafts)
    verdict = cap_chain_output(output_token_ids=out, emitted=emitted, lengths=torch.full((n,), length))
    for i in range(length + 1):  # position i: draft i if accepted past it, else the capped next token
        reached = verdict.accepted >= i
        token = torch.where(verdict.accepted > i, drafts[:, min(i, GAMMA - 1)], verdict.next_token)[reached]
        counts = torch.bincount(token, minlength=VOCAB).double()
        expected = p[0, i].double() / p[0, i].double().sum() * counts.sum()
        assert chisquare(counts, expected).pvalue > 1e-3, (i, counts, expected)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="output_token_ids"):
        cap_chain_output(output_token_ids=torch.zeros(2, 4), emitted=torch.zeros(3), lengths=torch.zeros(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashInfer's chain_speculative_sampling needs CUDA")
def test_flashinfer_ragged_chain_follows_the_target():
    pytest.importorskip("flashinfer", reason="flashinfer is not installed")
    n = 30_000
    p, q, drafts, _, _ = chain_case(n, 20)
    verdict = verify_sampled_flashinfer(target_probs=p.cuda(), draft_probs=q.cuda(), draft_tokens=drafts.cuda(),
                                        lengths=torch.full((n,), 2, device="cuda"))
    accepted, next_token = verdict.accepted.cpu(), verdict.next_token.cpu()
    assert int(accepted.max()) <= 2
    for i in range(3):
        reached = accepted >= i
        token = torch.where(accepted > i, drafts[:, min(i, GAMMA - 1)], next_token)[reached]
        counts = torch.bincount(token, minlength=VOCAB).double()
        assert chisquare(counts, p[0, i].double() / p[0, i].double().sum() * counts.sum()).pvalue > 1e-3
