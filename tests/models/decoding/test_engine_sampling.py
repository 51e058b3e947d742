"""At temperature 1, speculative sampling has the target's distribution (two-sample chi-square per position)."""
import pytest
import torch
from scipy.stats import chi2_contingency

from dspark.kernels.sps import SpsTable
from dspark.kernels.warping import SamplingParams
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy

# 1000 requests decode together here: a cost curve at that scale, so causal/lagged verify about one draft each
BATCH_SPS = SpsTable.from_probes({1: 1.0, 2000: 0.9, 3000: 0.75, 4000: 0.55, 6000: 0.35}, 8000)
POLICIES = {name: VerifyLengthPolicy.of(name, sps=BATCH_SPS) for name in ("causal", "lagged")}

SAMPLES = 2000
LENGTH = 3
P_MIN = 1e-3
MIN_POOLED = 20  # tokens seen fewer times than this (both samples together) share one "other" cell


def target_samples(target, prompt, params, seed):
    torch.manual_seed(seed)
    out = target.generate(torch.tensor([prompt]).expand(SAMPLES, -1), do_sample=True, max_new_tokens=LENGTH,
                          temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p,
                          eos_token_id=None, pad_token_id=0)
    return out[:, len(prompt):]


def speculative_samples(target, drafter, prompt, params, seed, policy):
    gen = torch.Generator().manual_seed(seed)
    outputs = []
    for _ in range(SAMPLES // 1000):
        outputs += SpeculativeDecoder(target, drafter, policy).generate(
            [prompt] * 1000, GenerationConfig(max_new_tokens=LENGTH, sampling=params), gen)
    return torch.tensor([g.token_ids for g in outputs]), outputs


def same_distribution_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    vocab = int(max(a.max(), b.max())) + 1
    counts = torch.stack([torch.bincount(a, minlength=vocab), torch.bincount(b, minlength=vocab)])
    common = counts.sum(0) >= MIN_POOLED
    table = torch.cat([counts[:, common], counts[:, ~common].sum(1, keepdim=True)], dim=1)
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table.numpy()).pvalue


@pytest.mark.parametrize("kind,params,policy", [
    ("dspark", SamplingParams(1.0), "fixed"), ("eagle3", SamplingParams(1.0), "fixed"),
    ("dflash", SamplingParams(1.0, top_k=20, top_p=0.9), "fixed"),
    ("dspark", SamplingParams(1.0), "causal"), ("dspark", SamplingParams(1.0), "lagged"),
])
def test_speculative_sampling_matches_target_sampling(kind, params, policy, embedded_target, embedded_drafters,
                                                      prompts):
    prompt = prompts[1]
    reference = target_samples(embedded_target, prompt, params, seed=1)
    chosen = POLICIES.get(policy, VerifyLengthPolicy.of("fixed"))
    speculative, outputs = speculative_samples(embedded_target, embedded_drafters[kind], prompt, params, seed=2,
                                               policy=chosen)
    assert sum(r.accepted for g in outputs for r in g.rounds) > SAMPLES // 10, "drafts must be accepted often"
    assert any(r.accepted < r.verify_len for g in outputs for r in g.rounds), "and rejected sometimes"
    for position in range(LENGTH):
        assert same_distribution_pvalue(reference[:, position], speculative[:, position]) > P_MIN, position
