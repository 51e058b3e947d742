"""`dspark check`: a fitting checkpoint is described; a misfit or malformed one is one clear error, exit 2."""
import json
import shutil

import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark.models.checkpoint import save_drafter
from dspark.models.drafters import DSpark, DrafterConfig
from dspark.ops.cli import main

from tests.conftest import TINY_TARGET_CONFIG


@pytest.fixture(scope="module")
def saved(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("check")
    tiny_target.save_pretrained(str(root / "target"))
    config = DrafterConfig.from_target(tiny_target.config, kind="dspark", block_size=4, target_layer_ids=(0, 2),
                                       num_hidden_layers=1, mask_token_id=1, markov_rank=8)
    save_drafter(DSpark.from_target(tiny_target, config), root / "drafter")
    return root


def test_check_describes_a_fitting_drafter(saved, capsys):
    assert main(["check", str(saved / "drafter"), "--target", str(saved / "target")]) == 0
    out = capsys.readouterr().out
    assert "dspark drafter (Qwen3DSparkModel), fits target" in out
    assert "gamma 4" in out and "target_layer_ids [0, 2]" in out and "markov head vanilla rank 8" in out


def test_check_names_every_mismatch_with_another_target(saved, tmp_path, capsys):
    other = Qwen3Config(**{**TINY_TARGET_CONFIG, "hidden_size": 48, "num_hidden_layers": 2})
    Qwen3ForCausalLM(other).save_pretrained(str(tmp_path / "other"))
    capsys.readouterr()  # drop save_pretrained's progress bar
    assert main(["check", str(saved / "drafter"), "--target", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dspark check: error:")
    assert "hidden_size is 32, the target's is 48" in err
    assert "target_layer_ids contains 2, outside the target's layers 0..1" in err


def test_check_describes_and_validates_a_draft_vocabulary(saved, tmp_path, capsys):
    copy = tmp_path / "drafter"
    shutil.copytree(saved / "drafter", copy)
    (copy / "draft_vocab.json").write_text('{"token_ids": [1, 5, 9]}')
    assert main(["check", str(copy), "--target", str(saved / "target")]) == 0
    assert "draft vocabulary: 3 of" in capsys.readouterr().out
    (copy / "draft_vocab.json").write_text('{"token_ids": [9, 5]}')
    assert main(["check", str(copy), "--target", str(saved / "target")]) == 2
    assert "draft_vocab.json: token_ids must be sorted, distinct" in capsys.readouterr().err


@pytest.mark.parametrize("broken", ["config.json", "model.safetensors"])
def test_check_reports_a_malformed_checkpoint(saved, tmp_path, capsys, broken):
    copy = tmp_path / "drafter"
    shutil.copytree(saved / "drafter", copy)
    (copy / broken).write_text("{ not valid")
    assert main(["check", str(copy), "--target", str(saved / "target")]) == 2
    assert broken in capsys.readouterr().err


def test_check_reports_a_missing_target(saved, tmp_path, capsys):
    assert main(["check", str(saved / "drafter"), "--target", str(tmp_path / "nowhere")]) == 2
    assert f"--target {tmp_path / 'nowhere'} has no config.json: pass a transformers model directory" in \
        capsys.readouterr().err


@pytest.fixture(scope="module")
def slim(tiny_target, saved):
    """A slim drafter (no frozen embedding / lm_head copies: checking it loads the target's weights)."""
    config = DrafterConfig.from_target(tiny_target.config, kind="dspark", block_size=4, target_layer_ids=(0, 2),
                                       num_hidden_layers=1, mask_token_id=1, markov_rank=8)
    return save_drafter(DSpark.from_target(tiny_target, config), saved / "slim", frozen=False)


def test_a_bad_drafter_config_is_named_before_the_targets_weights_are_read(saved, slim, tmp_path, capsys):
    """The target's weights were loaded first, and a bad drafter config was found only after them: here the
    target's weights are garbage, so the old order failed on them (a SafetensorError) and never named the config."""
    target = tmp_path / "target"
    shutil.copytree(saved / "target", target)
    (target / "model.safetensors").write_bytes(b"\xff" * 64)
    drafter = tmp_path / "drafter"
    shutil.copytree(slim, drafter)
    config = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**config, "target_layer_ids": [0, 9]}))
    assert main(["check", str(drafter), "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert "config.json: target_layer_ids contains 9, outside the target's decoder layers" in err and "model.safetensors" not in err
