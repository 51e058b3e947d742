"""The engine on the two target families we serve (Qwen3 and Llama, e.g. SmolLM2): greedy parity with
random drafters of every variant, whose drafts are mostly rejected, so corrections dominate."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from tests.conftest import TINY_TARGET_CONFIG
from tests.models.drafters.drafter_helpers import VARIANTS, make_drafter


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(1)
    settings = {k: v for k, v in TINY_TARGET_CONFIG.items() if k != "head_dim"}
    return LlamaForCausalLM(LlamaConfig(**settings)).eval()


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_random_drafters_keep_greedy_output_exact(family, variant, tiny_target, tiny_llama):
    target = tiny_target if family == "qwen3" else tiny_llama
    drafter = make_drafter(target, variant).eval()
    prompts = [[5, 9, 12, 3, 44, 8, 17], [30], [2, 2, 61, 7]]
    outputs = SpeculativeDecoder(target, drafter).generate(prompts, GenerationConfig(max_new_tokens=12))
    for prompt, out in zip(prompts, outputs):
        reference = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                    pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == reference
