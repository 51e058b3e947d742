"""A drafter computing in bfloat16 beside a float32 target (loading.py: drafter_dtype): the choice, and that the
output is still exactly the target's, greedy and sampled."""
import pytest
import torch

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.loading import Target, drafter_dtype, load_drafter_for
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError
from tests.models.decoding.conftest import KINDS
from tests.models.decoding.test_engine_greedy import MAX_NEW, target_greedy
from tests.models.decoding.test_engine_sampling import same_distribution_pvalue, target_samples, \
    speculative_samples, P_MIN
from tests.paths import EMBEDDED, EMBEDDED_TARGET


@pytest.mark.parametrize("native_bf16,target_dtype,device,expected", [
    (True, torch.float32, "cpu", torch.bfloat16),
    (False, torch.float32, "cpu", torch.float32),  # no native bf16: emulated bf16 matmuls are slower
    (True, torch.bfloat16, "cpu", torch.bfloat16),
    (True, torch.float16, "cpu", torch.float16),  # a half-precision target: the drafter follows it
    (True, torch.float32, "cuda", torch.float32),  # the CPU probe says nothing about a GPU
])
def test_auto_picks_bfloat16_only_for_a_float32_target_on_a_cpu_with_native_bf16(monkeypatch, native_bf16,
                                                                                  target_dtype, device, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native_bf16)
    assert drafter_dtype("auto", target_dtype, torch.device(device)) == expected


def test_a_named_dtype_is_taken_as_is_and_an_unknown_one_is_named():
    assert drafter_dtype("float32", torch.bfloat16, torch.device("cpu")) == torch.float32
    assert drafter_dtype("bfloat16", torch.float32, torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ConfigError, match="drafter dtype must be one of auto|float32|bfloat16, got 'fp8'"):
        drafter_dtype("fp8", torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def bf16_drafters(embedded_target, embedded_tokenizer):
    target = Target(embedded_target, embedded_tokenizer, (), EMBEDDED_TARGET)
    return {kind: load_drafter_for(EMBEDDED / kind, target, "bfloat16") for kind in KINDS}


def test_a_bfloat16_drafter_leaves_the_target_in_float32(embedded_target, bf16_drafters):
    assert all(d.dtype == torch.bfloat16 for d in bf16_drafters.values())
    assert {p.dtype for p in embedded_target.parameters()} == {torch.float32}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_size", [1, 8])
def test_bfloat16_drafters_keep_greedy_output_exact(kind, batch_size, embedded_target, bf16_drafters, prompts):
    references = [target_greedy(embedded_target, p, MAX_NEW) for p in prompts]
    decoder = SpeculativeDecoder(embedded_target, bf16_drafters[kind], VerifyLengthPolicy.of("fixed"))
    outputs = []
    for start in range(0, len(prompts), batch_size):
        outputs += decoder.generate(prompts[start:start + batch_size], GenerationConfig(max_new_tokens=MAX_NEW))
    assert [g.token_ids for g in outputs] == references
    assert max(r.accepted for g in outputs for r in g.rounds) >= 2, "the bf16 drafter should still be accepted"


def test_bfloat16_drafter_sampling_matches_target_sampling(embedded_target, bf16_drafters, prompts):
    params = SamplingParams(1.0)
    reference = target_samples(embedded_target, prompts[1], params, seed=1)
    speculative, outputs = speculative_samples(embedded_target, bf16_drafters["dspark"], prompts[1], params, seed=2,
                                               policy=VerifyLengthPolicy.of("fixed"))
    assert sum(r.accepted for g in outputs for r in g.rounds) > len(outputs) // 10, "drafts must be accepted often"
    assert any(r.accepted < r.verify_len for g in outputs for r in g.rounds), "and rejected sometimes"
    for position in range(reference.shape[1]):
        assert same_distribution_pvalue(reference[:, position], speculative[:, position]) > P_MIN, position
