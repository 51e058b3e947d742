"""`dspark train` end to end on a tiny target and corpus: export, card, resume, clear errors for bad input."""
import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark.models.checkpoint import load_drafter
from dspark.models.drafters.draft_vocab import load_draft_vocab
from dspark.models.embedded_target.tokenizer import MASK_TOKEN_ID, save_tokenizer, train_tokenizer
from dspark.models.errors import CheckpointError
from dspark.ops.cli import main


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A stdlib-like corpus of 40 files and a tiny Qwen3 target saved with a BPE trained on it."""
    root = tmp_path_factory.mktemp("train_cli")
    lib = root / "lib"
    lib.mkdir()
    g = torch.Generator().manual_seed(0)
    words = ["def", "return", "self", "value", "if", "else", "for", "in", "import", "class", "None", "x"]
    for i in range(40):
        picks = torch.randint(0, len(words), (120,), generator=g).tolist()
        lines = [" ".join(words[j] for j in picks[k : k + 6]) for k in range(0, 120, 6)]
        (lib / f"mod{i}.py").write_text("\n".join(lines))
    tokenizer = train_tokenizer([p.read_text() for p in sorted(lib.glob("*.py"))], vocab_size=300)
    target_dir = root / "target"
    save_tokenizer(tokenizer, target_dir)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                         tie_word_embeddings=True, eos_token_id=0, pad_token_id=0)
    Qwen3ForCausalLM(config).save_pretrained(str(target_dir))
    return root, target_dir, lib


def no_model_before_the_checks(*args, **kwargs):
    """Stands in for models.training.run.target_and_drafter where a job must fail on its inputs first."""
    raise AssertionError("a model was loaded before the job's inputs were checked")


def _args(root, target_dir, lib, drafter, out, *extra):
    return ["train", "--target", str(target_dir), "--drafter", drafter, "--out", str(out), "--stdlib", str(lib),
            "--data-cache", str(root / "cache"), "--steps", "3", "--num-samples", "8", "--prompt-len", "8",
            "--response-len", "12", "--batch-size", "4", "--block-size", "3", "--num-layers", "1",
            "--markov-rank", "8", "--n-anchors", "4", "--eval-samples", "2", "--threads", "1", "--log-every", "1",
            *extra]


@pytest.mark.parametrize("drafter", ["dspark", "eagle3"])
def test_train_exports_a_loadable_drafter_with_card(drafter, tiny_setup, capsys):
    root, target_dir, lib = tiny_setup
    out = root / f"out_{drafter}"
    assert main(_args(root, target_dir, lib, drafter, out)) == 0
    loaded = load_drafter(out, Qwen3ForCausalLM.from_pretrained(str(target_dir)).config)
    assert loaded.config.kind == drafter and loaded.config.target_layer_ids == (0, 1)
    assert loaded.dtype == torch.bfloat16
    if drafter == "dspark":
        assert loaded.config.mask_token_id == MASK_TOKEN_ID and loaded.config.markov_rank == 8
    card = (out / "README.md").read_text()
    assert "dspark train --target" in card and "--drafter " + drafter in card and "tau" in card
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 3 and len(log["history"]) == 3
    assert "wrote" in capsys.readouterr().out
    cached = sorted(path.name for path in (root / "cache").iterdir())
    assert any(name.endswith(".pt") for name in cached) and not any("partial" in name for name in cached), cached
    vocab = json.loads((out / "draft_vocab.json").read_text())
    assert 0 < len(vocab["token_ids"]) <= loaded.config.vocab_size and vocab["coverage"] == 1.0
    assert load_draft_vocab(out, loaded.config.vocab_size).tolist() == vocab["token_ids"]


def test_only_draft_vocab_writes_the_most_frequent_trained_tokens_and_trains_nothing(tiny_setup, capsys):
    root, target_dir, lib = tiny_setup
    out = root / "out_vocab"
    # a batch larger than the data: it trains nothing, so that is no reason to refuse it
    argv = _args(root, target_dir, lib, "dspark", out, "--only-draft-vocab", "--draft-vocab-size", "5",
                 "--batch-size", "16")
    assert main(argv) == 0
    assert sorted(path.name for path in out.iterdir()) == ["draft_vocab.json"]
    vocab = json.loads((out / "draft_vocab.json").read_text())
    assert len(vocab["token_ids"]) == 5 and 0 < vocab["coverage"] < 1 and "5 most frequent" in vocab["source"]
    assert f"wrote {out / 'draft_vocab.json'}" in capsys.readouterr().out


def test_resume_picks_up_the_latest_checkpoint(tiny_setup):
    root, target_dir, lib = tiny_setup
    out = root / "out_resume"
    assert main(_args(root, target_dir, lib, "dflash", out, "--eval-samples", "0")) == 0
    assert main(_args(root, target_dir, lib, "dflash", out, "--eval-samples", "0", "--resume")) == 0
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 3 and len(log["history"]) == 3, "nothing left to train after resuming at step 3"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target-layer-ids", "0", "2"], "final layer 2"),
        (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
        (["--steps", "0"], "steps must be >= 1"),
        (["--draft-vocab-size", "0"], "--draft-vocab-size must be >= 1"),
        (["--shard-target"], "--shard-target needs --data"),
    ],
)
def test_bad_input_is_one_clear_line(extra, message, tiny_setup, capsys):
    root, target_dir, lib = tiny_setup
    assert main(_args(root, target_dir, lib, "dspark", root / "bad", *extra)) == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("dspark train: error:") and message in last_line


def test_missing_target_is_reported(tmp_path, capsys):
    assert main(["train", "--target", str(tmp_path), "--drafter", "dflash", "--out", str(tmp_path / "o")]) == 2
    assert "has no config.json" in capsys.readouterr().err.strip().splitlines()[-1]


def test_chat_source_with_prompts_file_and_slim_export(tiny_setup, tmp_path):
    root, target_dir, lib = tiny_setup
    words = ["def", "return", "self", "value", "if", "else", "for", "in", "import", "class"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"{words[i % 10]} {words[(i * 7) % 10]} x{i}"]}) + "\n"
                               for i in range(60)))
    out = root / "out_chat"
    args = _args(root, target_dir, lib, "dspark", out, "--data-source", "chat", "--prompts-file", str(prompts),
                 "--prompt-len", "16", "--held-out-percent", "20", "--slim")
    assert main(args) == 0
    target = Qwen3ForCausalLM.from_pretrained(str(target_dir))
    with pytest.raises(CheckpointError, match="target_model="):
        load_drafter(out, target.config)
    assert load_drafter(out, target.config, target_model=target).config.kind == "dspark"
    card = (out / "README.md").read_text()
    assert "chat replies" in card and str(prompts) in card and "not stored" in card
    assert "--data-source chat" in card and "--slim" in card


def test_prompts_file_needs_the_chat_source(tiny_setup, tmp_path, capsys):
    root, target_dir, lib = tiny_setup
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["hi"]}\n')
    assert main(_args(root, target_dir, lib, "dspark", root / "x", "--prompts-file", str(prompts))) == 2
    assert "--prompts-file is read by --data-source chat only" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--builtin-prompts", "5"], "--builtin-prompts is read by --data-source chat only"),
    (["--data-source", "chat", "--builtin-prompts", "0"], "--builtin-prompts must be >= 1, or 0 with a --prompts-file"),
    (["--data-source", "chat", "--builtin-prompts", "-3"], "--builtin-prompts must be >= 1"),
])
def test_builtin_prompts_count_is_checked(tiny_setup, extra, message, capsys):
    root, target_dir, lib = tiny_setup
    assert main(_args(root, target_dir, lib, "dspark", root / "y", *extra)) == 2
    assert message in capsys.readouterr().err
