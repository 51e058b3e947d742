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
from dspark.models.training.self_chat import (TurnSampling, closed_turn, record_line, resume_point,
                                               user_turn_batches, user_turn_opening)
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


def sample_user_turns(target, tokenizer, count: int, **settings) -> list[str]:
    return [turn for _, added in user_turn_batches(target, tokenizer, TurnSampling(count, **settings), progress=False)
            for turn in added]


@needs_smollm2
def test_sampled_turns_are_distinct_closed_and_reproducible(chat_target):
    target, tokenizer = chat_target
    # seeds 0 and 2 fill 4 turns from one batch each (the test's cost)
    sample = lambda seed: sample_user_turns(target, tokenizer, 4, max_tokens=32, seed=seed, batch_size=8)  # noqa: E731
    turns = sample(0)
    assert len(turns) == len(set(turns)) == 4 and all(t and t == t.strip() for t in turns)
    assert sample(0) == turns and sample(2) != turns


@needs_smollm2
def test_sampling_gives_up_with_a_clear_error_when_turns_never_close(chat_target):
    target, tokenizer = chat_target
    with pytest.raises(ConfigError, match="user turns were closed and distinct in .* raise max_tokens"):
        sample_user_turns(target, tokenizer, 4, max_tokens=1, batch_size=8)


@needs_smollm2
def test_a_run_cut_short_or_extended_writes_the_file_one_run_writes(tmp_path, capsys):
    run = lambda out, count: main(["self-chat", "--target", str(SMOLLM2), "--count", str(count), "--seed", "0",  # noqa: E731
                                   "--max-tokens", "32", "--batch-size", "4", "--out", str(out)])
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    assert run(whole, 4) == 0 and len(read_turns(whole)) == 4, "a prompts file dspark train reads"
    assert run(resumed, 2) == 0
    assert whole.read_text().startswith(resumed.read_text())
    with resumed.open("a") as sink:
        sink.write('{"turns": ["a turn whose writer was kil')
    assert run(resumed, 4) == 0 and resumed.read_text() == whole.read_text(), "the cut line dropped, then extended"
    assert run(resumed, 4) == 0 and resumed.read_text() == whole.read_text()
    assert "already holds 4 user turns (--count 4): nothing to do" in capsys.readouterr().out


SAMPLING = TurnSampling(count=4, max_tokens=8, batch_size=4).recorded("0" * 64)


@pytest.mark.parametrize("flag, value", [("--count", "0"), ("--count", "10000001"), ("--max-tokens", "5000"),
                                         ("--batch-size", "100000000"), ("--seed", "-1"), ("--seed", str(2**63))])
def test_a_flag_out_of_bounds_is_refused_by_name_before_the_target_is_read(tmp_path, capsys, flag, value):
    args = {"--count": "4", flag: value}
    command = ["self-chat", "--target", str(tmp_path / "no-target"), "--out", str(tmp_path / "t.jsonl")]
    assert main(command + [word for pair in args.items() for word in pair]) == 2
    error = capsys.readouterr().err
    assert f"{flag} must be in [" in error and error.rstrip().endswith(f"got {value}")
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("lines, message", [
    ([record_line("a", 0, {**SAMPLING, "seed": 1})], "drawn with .*use the same settings"),
    (['{"turns": ["a"]}\n'], ":1 is not a self-chat record of this run"),
    ([record_line("a", 1, SAMPLING), record_line("b", 0, SAMPLING)], ":2 is not a self-chat record of this run"),
    ([record_line("a", 0, SAMPLING), record_line("a", 0, SAMPLING)], "repeats a turn"),
    (["my notes, no newline"], ":1 is not a self-chat record; write to a new --out"),
    (["[" * 100_000 + "\n"], ":1: not JSON this reader takes"),
])
def test_an_out_that_is_not_this_run_s_is_refused_and_left_as_it_was(tmp_path, lines, message):
    out = tmp_path / "turns.jsonl"
    out.write_text("".join(lines))
    with pytest.raises(ConfigError, match=message):
        resume_point(out, SAMPLING)
    assert out.read_text() == "".join(lines)


def test_a_run_resumes_from_its_last_batch_written(tmp_path):
    out = tmp_path / "turns.jsonl"
    assert resume_point(out, SAMPLING) == ([], 0)
    out.write_text(record_line("a", 0, SAMPLING) + record_line("b", 2, SAMPLING) + record_line("c", 2, SAMPLING)[:12])
    assert resume_point(out, SAMPLING) == (["a", "b"], 2), "batch 2 is drawn again: it may have been cut short"
    assert out.read_text() == record_line("a", 0, SAMPLING) + record_line("b", 2, SAMPLING)


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
