"""The embedded target pipeline: corpus selection and split, tokenizer, training, and the committed assets."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.embedded_target import corpus as corpus_module
from dspark.models.embedded_target.corpus import default_stdlib_root, is_held_out, load_corpus
from dspark.models.embedded_target.tokenizer import (
    EOS_TOKEN_ID,
    MASK_TOKEN,
    MASK_TOKEN_ID,
    encode_documents,
    save_tokenizer,
    train_tokenizer,
)
from dspark.models.embedded_target.train import TargetArchitecture, TrainSettings, train_target
from dspark.models.errors import ConfigError

from tests.paths import EMBEDDED_TARGET

INCLUDED = ["os.py", "json/decoder.py", "email/mime/text.py", "idlelib/editor.py"]
EXCLUDED = [
    "test/test_os.py", "unittest/test/test_case.py", "distutils/tests/test_core.py",
    "idlelib/idle_test/test_editor.py", "encodings/latin_1.py", "pydoc_data/topics.py",
    "site-packages/pip/__init__.py", "_sysconfigdata__linux_x86_64-linux-gnu.py",
    "config-3.11-x86_64-linux-gnu/python-config.py",
]
TINY_ARCH = TargetArchitecture(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                               intermediate_size=64, vocab_size=320, max_position_embeddings=64)


def make_stdlib(root, files, body="def f(x):\n    return x + 1\n"):
    for relative in files:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {relative}\n{body}")
    (root / "README.txt").write_text("not python")
    return root


def test_corpus_keeps_library_code_and_drops_tests_codecs_docs_and_build_files(tmp_path):
    corpus = load_corpus(make_stdlib(tmp_path, INCLUDED + EXCLUDED), held_out_percent=50)
    assert sorted(corpus.train_files + corpus.held_out_files) == sorted(INCLUDED)


def test_real_stdlib_split_is_disjoint_deterministic_and_about_five_percent():
    first, second = load_corpus(default_stdlib_root()), load_corpus(default_stdlib_root())
    assert first == second
    assert not set(first.train_files) & set(first.held_out_files)
    assert all(not is_held_out(p, 5) for p in first.train_files)
    assert all(is_held_out(p, 5) for p in first.held_out_files)
    total = len(first.train_files) + len(first.held_out_files)
    assert total > 300 and 0.02 < len(first.held_out_files) / total < 0.1
    assert not any(p.startswith(("test/", "encodings/", "pydoc_data/")) for p in first.train_files)


def test_split_of_a_file_does_not_depend_on_the_other_files(tmp_path):
    names = [f"pkg/mod_{i}.py" for i in range(60)]
    whole = load_corpus(make_stdlib(tmp_path / "a", names), held_out_percent=20)
    half = load_corpus(make_stdlib(tmp_path / "b", names[::2]), held_out_percent=20)
    assert set(half.held_out_files) == set(whole.held_out_files) & set(names[::2])


def test_corpus_rejects_a_bad_percent_or_an_empty_split(tmp_path):
    make_stdlib(tmp_path, INCLUDED)
    with pytest.raises(ConfigError, match="held_out_percent"):
        load_corpus(tmp_path, held_out_percent=0)
    with pytest.raises(ConfigError, match="non-empty"):
        load_corpus(tmp_path / "json", held_out_percent=5)


def test_corpus_skips_a_fifo_named_like_a_module(tmp_path):
    """Reading a FIFO blocks until a writer comes: `--stdlib` at a folder holding one hung."""
    root = make_stdlib(tmp_path, INCLUDED)
    os.mkfifo(root / "pipe.py")
    corpus = load_corpus(root, held_out_percent=50)
    assert sorted(corpus.train_files + corpus.held_out_files) == sorted(INCLUDED)


def test_corpus_refuses_a_root_far_bigger_than_a_stdlib(tmp_path, monkeypatch):
    """`--stdlib /` walked the whole disk and read every .py on it; the walk stops at its bounds."""
    root = make_stdlib(tmp_path, [f"p{i}/m.py" for i in range(12)])
    monkeypatch.setattr(corpus_module, "MAX_CORPUS_DIRS", 10)
    with pytest.raises(ConfigError, match="holds over 10 directories: not a CPython Lib/"):
        load_corpus(root)
    monkeypatch.setattr(corpus_module, "MAX_CORPUS_DIRS", 100)
    monkeypatch.setattr(corpus_module, "MAX_CORPUS_FILES", 5)
    with pytest.raises(ConfigError, match="holds over 5 .py files"):
        load_corpus(root)


@pytest.fixture(scope="module")
def small_tokenizer():
    corpus = load_corpus(default_stdlib_root())
    return train_tokenizer([corpus.read(p) for p in corpus.train_files[:15]], vocab_size=512)


def test_tokenizer_reserves_eos_and_mask_and_round_trips_text(small_tokenizer):
    assert small_tokenizer.token_to_id("<|endoftext|>") == EOS_TOKEN_ID == 0
    assert small_tokenizer.token_to_id(MASK_TOKEN) == MASK_TOKEN_ID == 1
    corpus = load_corpus(default_stdlib_root())
    texts = [corpus.read(p) for p in corpus.held_out_files[:5]]
    texts += ["\t  x = 'é€😀'\r\n\n", "", "<|mask", "mask|> <| endoftext"]
    for text in texts:
        ids = small_tokenizer.encode(text, add_special_tokens=False).ids
        assert small_tokenizer.decode(ids, skip_special_tokens=False) == text
        assert MASK_TOKEN_ID not in ids and EOS_TOKEN_ID not in ids


def test_documents_are_packed_with_eos_after_each(small_tokenizer):
    ids = encode_documents(small_tokenizer, ["a = 1\n", "b = 2\n"])
    assert [i for i, token in enumerate(ids) if token == EOS_TOKEN_ID] == [len(ids) // 2 - 1, len(ids) - 1]


def test_saved_tokenizer_loads_with_special_ids_and_chat_template(small_tokenizer, tmp_path):
    save_tokenizer(small_tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.mask_token_id) == (0, 0, 1)
    assert loaded.decode(loaded("def f():\n    pass\n").input_ids) == "def f():\n    pass\n"
    messages = [{"role": "system", "content": "import os"}, {"role": "user", "content": "def main():"}]
    prompt = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "import os\ndef main():"


def test_lr_schedule_warms_up_then_decays_to_the_floor_at_the_budget():
    settings = TrainSettings(max_steps=100, max_minutes=10, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert settings.lr_at(0, 0.0) == pytest.approx(1e-4)
    assert settings.lr_at(10, 0.1) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(0.1 * math.pi))))
    assert settings.lr_at(99, 1.0) == pytest.approx(1e-4)
    assert settings.progress(step=20, elapsed_s=300) == pytest.approx(0.5)  # time binds: 5 of 10 minutes
    assert settings.progress(step=80, elapsed_s=300) == pytest.approx(0.8)  # steps bind


@pytest.mark.parametrize("bad", [dict(), dict(max_steps=0), dict(max_steps=5, min_lr_ratio=2.0)])
def test_train_settings_reject_a_missing_budget_or_bad_values(bad):
    with pytest.raises(ConfigError):
        TrainSettings(**bad)


def test_architecture_rejects_heads_not_divisible_by_kv_heads():
    with pytest.raises(ConfigError, match="num_kv_heads"):
        TargetArchitecture(num_heads=4, num_kv_heads=3)


def test_a_few_steps_lower_the_loss_and_the_saved_model_loads(tmp_path):
    source = default_stdlib_root()
    names = ["bisect.py", "colorsys.py", "keyword.py", "this.py", "shlex.py", "glob.py", "fnmatch.py"]
    root = tmp_path / "lib"
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((source / name).read_text())
    corpus = load_corpus(root, held_out_percent=30)
    settings = TrainSettings(max_steps=40, seq_len=32, batch_size=8, lr=3e-3, warmup_steps=5, eval_every=20)
    log = train_target(corpus, TINY_ARCH, settings, tmp_path / "out", command="dspark embedded-target --test")
    losses = [entry["loss"] for entry in log["history"]]
    assert losses[-1] < losses[0] - 0.5
    assert log["steps"] == 40 and log["tokens_seen"] == 40 * 8 * 32
    assert math.isfinite(log["held_out_perplexity"]) and log["held_out_perplexity"] < TINY_ARCH.vocab_size
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert model.config.hidden_size == 32 and model.config.eos_token_id == 0
    assert model.generation_config.eos_token_id == 0
    assert AutoTokenizer.from_pretrained(tmp_path / "out").mask_token_id == MASK_TOKEN_ID
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"{log['held_out_perplexity']:.2f}" in card and "dspark embedded-target --test" in card
    assert [sample["prompt"] in card for sample in log["samples"]] == [True] * 3
    table_rows = [line.replace("\\|", "") for line in card.splitlines() if line.startswith("| ")]
    assert any("<\\|mask\\|>" in line for line in card.splitlines())
    assert table_rows and all(row.count("|") == 3 for row in table_rows), "a cell's '|' splits a table row"


def test_committed_target_loads_matches_its_card_and_generates():
    log = json.loads((EMBEDDED_TARGET / "train_log.json").read_text())
    card = (EMBEDDED_TARGET / "README.md").read_text()
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET).eval()
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    arch = log["architecture"]
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.intermediate_size, config.vocab_size) == (
        arch["hidden_size"], arch["num_layers"], arch["num_heads"], arch["num_kv_heads"], arch["head_dim"],
        arch["intermediate_size"], arch["vocab_size"])
    assert sum(p.numel() for p in model.parameters()) == log["parameters"]
    assert f"{log['parameters']:,}" in card and f"{log['held_out_perplexity']:.2f}" in card
    assert tokenizer.convert_tokens_to_ids(MASK_TOKEN) == MASK_TOKEN_ID == tokenizer.mask_token_id
    assert tokenizer.eos_token_id == EOS_TOKEN_ID == config.eos_token_id
    assert sum(f.stat().st_size for f in EMBEDDED_TARGET.iterdir()) <= 20 * 1024 * 1024
    input_ids = tokenizer("def __init__(self", return_tensors="pt").input_ids
    with torch.no_grad():
        generated = model.generate(input_ids, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > input_ids.shape[1] and MASK_TOKEN_ID not in generated[0].tolist()
