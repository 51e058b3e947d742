"""`dspark train` speed and init levers on a tiny target: --feature-cache, --init-from-target, --init-from-drafter,
--bf16, --loss-over-draft-vocab, --loss."""
import json
import math

import pytest
import torch

from test_train_command import _args, no_model_before_the_checks, tiny_setup  # noqa: F401  (a module fixture)

from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from dspark.models.checkpoint import is_compact, load_drafter
from dspark.models.drafters.draft_vocab import load_draft_vocab, save_draft_vocab
from dspark.ops.cli import main
from dspark.ops.commands import train as train_command


def test_feature_cache_is_built_once_then_reused(tiny_setup, tmp_path):  # noqa: F811
    root, target_dir, lib = tiny_setup
    cache = tmp_path / "features"
    for run in ("first", "second"):
        args = _args(root, target_dir, lib, "dspark", tmp_path / run, "--feature-cache", str(cache),
                     "--eval-samples", "0")
        assert main(args) == 0
        if run == "first":
            (stored,) = cache.glob("*/shard-00000.hidden.bf16")
            written = stored.stat().st_mtime_ns
    assert stored.stat().st_mtime_ns == written, "the second run read the store instead of recomputing it"
    key = json.loads((stored.parent / "manifest.json").read_text())["key"]
    assert key["target_layer_ids"] == [0, 1] and key["autocast"] == "none"
    assert "--feature-cache" in (tmp_path / "second" / "README.md").read_text()


@pytest.mark.parametrize("native", [True, False])
def test_init_from_target_and_bf16_are_recorded_in_the_card(tiny_setup, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                            native):
    """... and --bf16 on a CPU that emulates bf16 warns that it is slow there (the run still completes)."""
    monkeypatch.setattr(train_command, "computes_bf16_natively", lambda device: native)
    root, target_dir, lib = tiny_setup
    out = tmp_path / "out"
    args = _args(root, target_dir, lib, "dflash", out, "--init-from-target", "--bf16", "--eval-samples", "0",
                 "--data-cache", str(tmp_path / "data"))
    assert main(args) == 0
    card = (out / "README.md").read_text()
    assert "--init-from-target" in card and "--bf16" in card
    (data_key,) = (tmp_path / "data").glob("*.json")
    assert json.loads(data_key.read_text())["generation_autocast"] == "bfloat16", "bf16 data has its own cache key"
    warned = "no native bf16" in capsys.readouterr().err
    assert warned is not native


def test_init_from_drafter_fine_tunes_a_trained_drafter_and_refuses_another(tiny_setup, tmp_path, capsys,  # noqa: F811
                                                                           monkeypatch):
    root, target_dir, lib = tiny_setup
    trained, tuned, fresh = tmp_path / "trained", tmp_path / "tuned", tmp_path / "fresh"
    assert main(_args(root, target_dir, lib, "dspark", trained, "--eval-samples", "0", "--save-dtype", "float32")) == 0
    almost_no_step = ("--eval-samples", "0", "--save-dtype", "float32", "--steps", "1", "--lr", "1e-9", "--seed", "7")
    assert main(_args(root, target_dir, lib, "dspark", tuned, "--init-from-drafter", str(trained),
                      *almost_no_step)) == 0
    assert main(_args(root, target_dir, lib, "dspark", fresh, *almost_no_step)) == 0
    start, after, scratch = (load_weights(path, target_dir) for path in (trained, tuned, fresh))
    assert all(torch.allclose(after[name], start[name], atol=1e-6) for name in start), "fine-tuning starts there"
    assert not all(torch.allclose(scratch[name], start[name], atol=1e-6) for name in start)
    assert f"the trained drafter {trained} (--init-from-drafter)" in (tuned / "README.md").read_text()
    assert main(_args(root, target_dir, lib, "dspark", tmp_path / "other", "--init-from-drafter", str(trained),
                      "--eval-samples", "0", "--block-size", "4")) == 2
    assert (f"--init-from-drafter {trained} is another drafter than this job trains: block_size 3 (this job: 4)"
            in capsys.readouterr().err)
    assert main(_args(root, target_dir, lib, "dspark", tmp_path / "both", "--init-from-drafter", str(trained),
                      "--init-from-target")) == 2
    assert "two starting points" in capsys.readouterr().err
    (trained / "draft_vocab.json").write_text('{"token_ids": [3, 1]}')
    monkeypatch.setattr("dspark.models.training.run.target_and_drafter", no_model_before_the_checks)
    assert main(_args(root, target_dir, lib, "dspark", tmp_path / "bad-vocab", "--init-from-drafter", str(trained),
                      *almost_no_step)) == 2
    assert "draft_vocab.json: token_ids must be sorted" in capsys.readouterr().err


def test_loss_over_draft_vocab_trains_only_that_vocabulary(tiny_setup, tmp_path):  # noqa: F811
    """The Markov W2 rows of tokens outside draft_vocab.json never get a gradient (no weight decay: they stay
    exactly as they started in the training state) while those inside are trained; the export keeps only the
    trained rows (a compact checkpoint: zeros outside once loaded); the card says how the loss ran. The fine-tune's
    vocabulary keeps the one of the drafter it starts from whole and adds the most frequent tokens it lacks."""
    root, target_dir, lib = tiny_setup
    trained, tuned = tmp_path / "trained", tmp_path / "tuned"
    assert main(_args(root, target_dir, lib, "dspark", trained, "--eval-samples", "0", "--save-dtype", "float32")) == 0
    vocab_size = AutoConfig.from_pretrained(str(target_dir)).vocab_size
    started = torch.arange(vocab_size - 16, vocab_size)  # the top ids: ones a recount of the data would not pick
    save_draft_vocab(trained, started, "the test's", counted_tokens=0, coverage=0.0)
    assert main(_args(root, target_dir, lib, "dspark", tuned, "--init-from-drafter", str(trained),
                      "--loss-over-draft-vocab", "--draft-vocab-size", "24", "--weight-decay", "0", "--lr", "1e-2",
                      "--save-dtype", "float32")) == 0
    vocab = load_draft_vocab(tuned, vocab_size)
    assert len(vocab) == 24 and set(started.tolist()) < set(vocab.tolist())
    source = json.loads((tuned / "draft_vocab.json").read_text())["source"]
    assert f"the 16 of {trained}'s draft vocabulary and 8 more" in source
    start, exported = (load_weights(path, target_dir)["markov_head.markov_w2.weight"] for path in (trained, tuned))
    latest = tuned / "work" / "checkpoints" / (tuned / "work" / "checkpoints" / "latest").read_text().strip()
    after = torch.load(latest / "trainer_state.pt", weights_only=False)["drafter"]["markov_head.markov_w2.weight"]
    outside = torch.ones(len(start), dtype=torch.bool).index_fill_(0, vocab, False)
    assert torch.equal(after[outside], start[outside])
    assert not torch.allclose(after[vocab], start[vocab])
    assert is_compact(tuned) and torch.equal(exported[vocab], after[vocab]) and not exported[outside].any()
    card = (tuned / "README.md").read_text()
    assert "logits and loss over the draft vocabulary only (--loss-over-draft-vocab" in card
    assert "## Held-out check" in card, "the held-out check ran, drafting among the draft vocabulary"


def test_eagle3_over_a_draft_vocabulary_exports_sglangs_draft_head(tiny_setup, tmp_path):  # noqa: F811
    """Eagle3 trains over the draft vocabulary too, and exports SGLang's layout for it: draft_vocab_size, the
    target's head rows of those tokens and d2t, which load back to the drafter that trained."""
    root, target_dir, lib = tiny_setup
    out = tmp_path / "eagle3"
    assert main(_args(root, target_dir, lib, "eagle3", out, "--loss-over-draft-vocab", "--draft-vocab-size", "24",
                      "--save-dtype", "float32")) == 0
    vocab = load_draft_vocab(out, AutoConfig.from_pretrained(str(target_dir)).vocab_size)
    assert len(vocab) == 24
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 24
    tensors = load_file(str(out / "model.safetensors"))
    target_head = AutoModelForCausalLM.from_pretrained(str(target_dir)).lm_head.weight
    assert torch.equal(tensors["d2t"] + torch.arange(24), vocab)
    assert torch.equal(tensors["lm_head.weight"], target_head[vocab].detach())
    log = json.loads((out / "train_log.json").read_text())
    assert log["job"]["loss_over_draft_vocab"] and math.isfinite(log["history"][-1]["loss"])
    assert "logits and loss over the draft vocabulary only" in (out / "README.md").read_text()


def test_greedy_loss_trains_the_targets_argmax_and_eagle3_refuses_it(tiny_setup, tmp_path, capsys):  # noqa: F811
    """--loss greedy reaches the loss (its logged CE differs from the sampling loss's on the same seed and data),
    the card and the log say which loss ran; Eagle3 has no block loss to swap and is refused before loading."""
    root, target_dir, lib = tiny_setup
    ce = {}
    for loss in ("sampling", "greedy"):
        out = tmp_path / loss
        assert main(_args(root, target_dir, lib, "dspark", out, "--loss", loss, "--eval-samples", "0")) == 0
        log = json.loads((out / "train_log.json").read_text())
        ce[loss] = log["history"][0]["ce"]
        assert log["job"]["loss"] == loss
    assert ce["greedy"] != pytest.approx(ce["sampling"])
    assert "the greedy-matched loss (--loss greedy" in (tmp_path / "greedy" / "README.md").read_text()
    assert main(_args(root, target_dir, lib, "eagle3", tmp_path / "e", "--loss", "greedy")) == 2
    assert "--loss greedy trains the block drafters (dspark, dflash)" in capsys.readouterr().err


def load_weights(drafter_dir, target_dir) -> dict:
    return load_drafter(drafter_dir, AutoConfig.from_pretrained(str(target_dir))).state_dict()
