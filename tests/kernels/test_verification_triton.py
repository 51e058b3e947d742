"""verify_greedy_triton / verify_sampled_triton equal the PyTorch references (kernels/verification.py).

Greedy: the same n and next token for any logits. Sampled: the same n and next token on the same uniforms.
Cases: random ragged blocks, l = 0, l = K, everything accepted, everything rejected, an EOS draft accepted
mid-block, vocabularies wider than one kernel chunk, bf16 logits; and the host's shape checks.
"""
import pytest
import torch

from dspark.kernels import triton_launch
from dspark.kernels.verification import (verify_greedy_torch, verify_greedy_triton, verify_sampled_torch,
                                         verify_sampled_triton)

EOS = 0


def assert_same(reference, kernel):
    assert torch.equal(reference.accepted.cpu(), kernel.accepted.cpu()), (reference, kernel)
    assert torch.equal(reference.next_token.cpu(), kernel.next_token.cpu()), (reference, kernel)


def greedy_case(bs, K, vocab, seed, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, K + 1, vocab, generator=g).to(dtype)
    drafts = logits[:, :K].argmax(-1)
    miss = torch.rand(bs, K, generator=g) < 0.25  # some drafts disagree with the target
    drafts = torch.where(miss, (drafts + 1) % vocab, drafts)
    lengths = torch.randint(0, K + 1, (bs,), generator=g)
    return dict(target_logits=logits.to(device), draft_tokens=drafts.to(device), lengths=lengths.to(device))


@pytest.mark.parametrize("bs,K,vocab,seed", [(1, 1, 7, 0), (8, 5, 64, 1), (16, 7, 300, 2), (3, 4, 5000, 3),
                                             (4, 0, 33, 4)])
def test_greedy_equals_reference(bs, K, vocab, seed, device):
    case = greedy_case(bs, K, vocab, seed, device)
    assert_same(verify_greedy_torch(**case), verify_greedy_triton(**case))


def test_greedy_bf16_logits_and_edges(device):
    case = greedy_case(6, 4, 97, 5, device, torch.bfloat16)
    logits = case["target_logits"]
    perfect = logits[:, :4].argmax(-1)
    case["draft_tokens"] = perfect.clone()
    case["draft_tokens"][1] = (perfect[1] + 1) % 97  # all rejected
    case["lengths"] = torch.tensor([4, 4, 0, 2, 3, 1], device=device)  # l = K, l = 0, partial
    ref, ker = verify_greedy_torch(**case), verify_greedy_triton(**case)
    assert_same(ref, ker)
    assert ker.accepted.tolist() == [4, 0, 0, 2, 3, 1]


def test_greedy_eos_mid_block(device):
    logits = torch.full((1, 4, 9), -5.0)
    logits[0, 0, 3], logits[0, 1, EOS], logits[0, 2, 6], logits[0, 3, 2] = 5.0, 5.0, 5.0, 5.0
    case = dict(target_logits=logits.to(device), draft_tokens=torch.tensor([[3, EOS, 6]], device=device),
                lengths=torch.tensor([3], device=device))
    ker = verify_greedy_triton(**case)
    assert_same(verify_greedy_torch(**case), ker)
    assert ker.accepted.tolist() == [3] and ker.next_token.tolist() == [2]  # the engine cuts at the EOS


def sampled_case(bs, K, vocab, seed, device, *, sharpness=1.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(sharpness * torch.randn(bs, K + 1, vocab, generator=g), -1)
    q = torch.softmax(sharpness * torch.randn(bs, K, vocab, generator=g), -1)
    q = torch.where(torch.rand(bs, K, 1, generator=g) < 0.3, p[:, :K], q)  # some rows: q = p, always accepted
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(bs, K) if K else \
        torch.zeros(bs, 0, dtype=torch.long)
    lengths = torch.randint(0, K + 1, (bs,), generator=g)
    return dict(target_probs=p.to(device), draft_probs=q.to(device), draft_tokens=drafts.to(device),
                lengths=lengths.to(device), uniforms=torch.rand(bs, K, generator=g).to(device),
                final_uniforms=torch.rand(bs, generator=g).to(device))


@pytest.mark.parametrize("bs,K,vocab,seed", [(1, 1, 7, 0), (32, 5, 64, 1), (16, 7, 300, 2), (4, 3, 5000, 3),
                                             (5, 0, 40, 4)])
def test_sampled_equals_reference_on_the_same_uniforms(bs, K, vocab, seed, device):
    case = sampled_case(bs, K, vocab, seed, device)
    assert_same(verify_sampled_torch(**case), verify_sampled_triton(**case))


def test_sampled_all_accepted_all_rejected_and_zero_length(device):
    vocab, K = 11, 3
    p = torch.softmax(torch.randn(4, K + 1, vocab, generator=torch.Generator().manual_seed(7)), -1)
    p[:, :, 10] = 0.0  # the target never emits token 10
    p = p / p.sum(-1, keepdim=True)
    q = p[:, :K].clone()
    q[1] = torch.nn.functional.one_hot(torch.tensor(10), vocab).float()  # request 1 drafts only token 10
    drafts = torch.stack([p[0, :K].argmax(-1), torch.full((K,), 10), p[2, :K].argmax(-1), p[3, :K].argmax(-1)])
    case = dict(target_probs=p.to(device), draft_probs=q.to(device), draft_tokens=drafts.to(device),
                lengths=torch.tensor([K, K, 0, 2], device=device),
                uniforms=torch.full((4, K), 0.5, device=device), final_uniforms=torch.tensor([0.1, 0.9, 0.5, 0.3], device=device))
    ker = verify_sampled_triton(**case)
    assert_same(verify_sampled_torch(**case), ker)
    assert ker.accepted.tolist() == [K, 0, 0, 2]  # q = p accepts everything; token 10 is never accepted
    assert ker.next_token[1].item() != 10


def test_sampled_many_rounds_of_peaked_distributions(device):
    """Sharp p and q put the inverse-CDF threshold near few large steps: the float64 sums must agree."""
    case = sampled_case(256, 6, 128, 9, device, sharpness=4.0)
    assert_same(verify_sampled_torch(**case), verify_sampled_triton(**case))


def test_host_checks_name_the_bad_shape(device):
    case = sampled_case(2, 3, 10, 0, device)
    with pytest.raises(ValueError, match=r"draft_probs must be \[2, 3, vocab\]"):
        verify_sampled_triton(**{**case, "draft_probs": case["draft_probs"][:, :2]})
    with pytest.raises(ValueError, match=r"uniforms must be \[2, 3\]"):
        verify_sampled_triton(**{**case, "uniforms": case["uniforms"][:, :1]})
    with pytest.raises(ValueError, match=r"target_logits must be \[2, 4, vocab\]"):
        verify_greedy_triton(target_logits=case["target_probs"][:, :3], draft_tokens=case["draft_tokens"],
                             lengths=case["lengths"])


def test_cpu_tensors_take_the_reference_by_default():
    assert not triton_launch.use_triton(torch.zeros(1))


def test_an_empty_residual_falls_back_to_the_target(device):
    """q = p rejected (a coin of exactly 1): max(p - q, 0) has no mass, so the next token is drawn from p."""
    p = torch.softmax(torch.randn(3, 3, 20, generator=torch.Generator().manual_seed(3)), -1)
    case = dict(target_probs=p.to(device), draft_probs=p[:, :2].contiguous().to(device),
                draft_tokens=p[:, :2].argmax(-1).to(device), lengths=torch.tensor([2, 1, 2], device=device),
                uniforms=torch.ones(3, 2, device=device), final_uniforms=torch.tensor([0.2, 0.5, 0.99], device=device))
    ker = verify_sampled_triton(**case)
    assert_same(verify_sampled_torch(**case), ker)
    assert ker.accepted.tolist() == [0, 0, 0]
