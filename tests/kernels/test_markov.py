"""kernels/markov.py: the Triton Markov step equals its reference, and both draw from softmax(logits / T)."""
import pytest
import torch
from scipy.stats import chisquare

from dspark.kernels.markov import markov_sample_step, markov_sample_step_torch, markov_sample_step_triton
from dspark.kernels.warping import SamplingParams


def step_case(bs, vocab, rank, seed, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return dict(base_logits=torch.randn(bs, vocab, generator=g).to(device, dtype),
                code=torch.randn(bs, rank, generator=g).to(device, dtype),
                w2=(0.3 * torch.randn(vocab, rank, generator=g)).to(device, dtype))


@pytest.mark.parametrize("bs,vocab,rank,seed", [(1, 7, 4, 0), (8, 300, 64, 1), (3, 5000, 100, 2)])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_triton_step_equals_reference(bs, vocab, rank, seed, temperature, device):
    case = step_case(bs, vocab, rank, seed, device)
    sampling = SamplingParams(temperature)
    uniforms = None if sampling.greedy else torch.rand(bs, generator=torch.Generator().manual_seed(seed)).to(device)
    ref_tokens, ref_logits = markov_sample_step_torch(**case, sampling=sampling, uniforms=uniforms)
    tokens, logits = markov_sample_step_triton(**case, sampling=sampling, uniforms=uniforms)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(tokens.cpu(), ref_tokens.cpu())


def test_bf16_logits_keep_their_dtype(device):
    case = step_case(4, 257, 32, 3, device, torch.bfloat16)
    tokens, logits = markov_sample_step_triton(**case, sampling=SamplingParams(), uniforms=None)
    assert logits.dtype == torch.bfloat16
    ref_tokens, ref_logits = markov_sample_step_torch(**case, sampling=SamplingParams(), uniforms=None)
    torch.testing.assert_close(logits.float(), ref_logits.float(), rtol=2e-2, atol=5e-2)


def test_samples_follow_the_tempered_softmax(device):
    vocab, n = 5, 600  # the interpreter runs one program per row: keep n small on CPU
    case = step_case(1, vocab, 3, 4, device)
    case = {k: v.expand(n, -1) if k != "w2" else v for k, v in case.items()}
    sampling = SamplingParams(0.8)
    tokens, logits = markov_sample_step_triton(**case, sampling=sampling,
                                               uniforms=torch.rand(n, generator=torch.Generator().manual_seed(1)).to(device))
    counts = torch.bincount(tokens.cpu(), minlength=vocab).double()
    expected = torch.softmax(logits[0].float().cpu() / 0.8, -1).double()
    expected = expected / expected.sum() * counts.sum()
    assert chisquare(counts, expected).pvalue > 1e-3


def test_warps_beyond_temperature_are_refused_by_name_and_dispatched_to_the_reference(device):
    case = step_case(2, 50, 8, 5, device)
    with pytest.raises(ValueError, match="top_k=5"):
        markov_sample_step_triton(**case, sampling=SamplingParams(1.0, top_k=5), uniforms=torch.rand(2).to(device))
    tokens, _ = markov_sample_step(case["base_logits"], case["code"], case["w2"], SamplingParams(1.0, top_k=5),
                                   torch.Generator(device).manual_seed(0))
    top5 = (case["base_logits"] + case["code"] @ case["w2"].T).topk(5, dim=-1).indices
    assert (top5 == tokens[:, None]).any(dim=1).all()


def test_shape_checks_name_the_tensors(device):
    case = step_case(2, 50, 8, 6, device)
    with pytest.raises(ValueError, match=r"w2 \[50, rank\]"):
        markov_sample_step_triton(**{**case, "w2": case["w2"][:40]}, sampling=SamplingParams(), uniforms=None)
    with pytest.raises(ValueError, match=r"uniforms \[2\]"):
        markov_sample_step_triton(**case, sampling=SamplingParams(1.0), uniforms=None)
