"""User turns sampled from the target itself (models/training/self_chat.py), and training on them mixed with the
built-in prompts (run.chat_prompt_texts)."""
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.cache import cache_root
from dspark.models.embedded_target.corpus import DEFAULT_HELD_OUT_PERCENT, default_stdlib_root, load_corpus
from dspark.models.errors import ConfigError
from dspark.models.prompts import read_turns
from dspark.models.targets.smollm2 import is_provided, target_dir
from dspark.models.training.documents import chat_prompt_texts
from dspark.models.training.self_chat import closed_turn, sample_user_turns, user_turn_opening
from dspark.ops.cli import main
from tests.paths import EMBEDDED_TARGET


SMOLLM2 = target_dir(cache_root())
needs_smollm2 = pytest.mark.skipif(not is_provided(SMOLLM2), reason=f"{SMOLLM2} not provided: run make setup")


@pytest.fixture(scope="module")
def chat_target():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return AutoModelForCausalLM.from_pretrained(str(SMOLLM2), dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(str(SMOLLM2))


@needs_smollm2
def test_the_opening_is_the_template_up_to_the_users_text(chat_target):
    _, tokenizer = chat_target
    opening = tokenizer.decode(user_turn_opening(tokenizer))
    full = tokenizer.apply_chat_template([{"role": "user", "content": "How do tides work?"}], tokenize=False)
    assert opening.endswith("user\n") and full.startswith(opening)
    assert full[len(opening):].startswith("How do tides work?")


def test_a_tokenizer_without_turn_markers_is_refused():
    with pytest.raises(ConfigError, match="no chat template"):
        user_turn_opening(SimpleNamespace(chat_template=None))
    with pytest.raises(ConfigError, match="puts nothing before the user's text"):  # the embedded code LM's template
        user_turn_opening(AutoTokenizer.from_pretrained(EMBEDDED_TARGET))


@needs_smollm2
def test_only_a_turn_the_model_closed_counts(chat_target):
    _, tokenizer = chat_target
    end = tokenizer.eos_token_id
    words = tokenizer.encode(" What is a list?", add_special_tokens=False)
    assert closed_turn(words + [end], end, tokenizer) == "What is a list?"
    assert closed_turn(words, end, tokenizer) == ""
    assert closed_turn([end], end, tokenizer) == ""


@needs_smollm2
def test_sampled_turns_are_distinct_closed_and_reproducible(chat_target):
    target, tokenizer = chat_target
    sample = lambda seed: sample_user_turns(target, tokenizer, 4, max_tokens=40, seed=seed, batch_size=8,  # noqa: E731
                                            progress=False)
    turns = sample(3)
    assert len(turns) == len(set(turns)) == 4 and all(t and t == t.strip() for t in turns)
    assert sample(3) == turns and sample(4) != turns


@needs_smollm2
def test_sampling_gives_up_with_a_clear_error_when_turns_never_close(chat_target):
    target, tokenizer = chat_target
    with pytest.raises(ConfigError, match="user turns were closed and distinct in .* raise max_tokens"):
        sample_user_turns(target, tokenizer, 4, max_tokens=1, batch_size=8, progress=False)


@needs_smollm2
def test_the_command_writes_a_prompts_file_train_reads(tmp_path, capsys):
    out = tmp_path / "turns.jsonl"
    assert main(["self-chat", "--target", str(SMOLLM2), "--count", "3", "--max-tokens", "40", "--batch-size", "8",
                 "--out", str(out)]) == 0
    assert f"wrote 3 user turns to {out}" in capsys.readouterr().out
    assert len(read_turns(out)) == 3 and all(read_turns(out))


def test_the_command_refuses_a_target_without_turn_markers(tmp_path, capsys):
    assert main(["self-chat", "--target", str(EMBEDDED_TARGET), "--count", "3", "--out", str(tmp_path / "t")]) == 2
    assert "puts nothing before the user's text" in capsys.readouterr().err


def test_training_prompts_mix_the_builtin_set_and_a_file(tmp_path):
    corpus = load_corpus(default_stdlib_root(), DEFAULT_HELD_OUT_PERCENT)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["first own turn"]}\n{"turns": ["second own turn"]}\n{"turns": ["first own turn"]}\n')
    job = lambda file, builtin: SimpleNamespace(prompts_file=file, builtin_prompts=builtin)  # noqa: E731
    texts, source = chat_prompt_texts(job(prompts, 30), corpus)
    assert len(texts) == 32 and texts[-2:] == ["first own turn", "second own turn"]
    assert source == f"built-in generated set (30 prompts, seed 0) and {prompts}"
    assert chat_prompt_texts(job(prompts, None), corpus)[0] == ["first own turn", "second own turn"]
    with pytest.raises(ConfigError, match="no chat prompts"):
        chat_prompt_texts(job(None, 0), corpus)
