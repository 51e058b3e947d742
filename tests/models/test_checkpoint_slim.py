"""Slim drafter checkpoints: no frozen embedding / lm_head copies; load_drafter completes them from the target.

tests/models/test_checkpoint_sglang.py checks that SGLang loads them and takes both from the target.
"""
import json

import pytest
import torch
from safetensors.torch import load_file

from dspark.models.checkpoint import FROZEN_WEIGHTS, load_drafter, save_drafter, stores_frozen_weights
from dspark.models.errors import CheckpointError
from dspark.ops.cli import main
from tests.models.drafters.drafter_helpers import VARIANTS, make_drafter
from tests.models.test_checkpoint import outputs


@pytest.fixture(scope="module")
def slim(tiny_target, tmp_path_factory):
    """variant -> (drafter, slim checkpoint directory, full checkpoint directory)."""
    root = tmp_path_factory.mktemp("slim")
    out = {}
    for variant in VARIANTS:
        drafter = make_drafter(tiny_target, variant)
        out[variant] = (drafter, save_drafter(drafter, root / variant, frozen=False),
                        save_drafter(drafter, root / f"{variant}_full"))
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_slim_checkpoint_stores_only_trained_weights(slim, variant):
    drafter, path, full = slim[variant]
    names = set(load_file(str(path / "model.safetensors")))
    assert names == set(load_file(str(full / "model.safetensors"))) - set(FROZEN_WEIGHTS)
    assert names == {n for n, p in drafter.named_parameters() if p.requires_grad} | \
        {n for n, _ in drafter.named_buffers() if n in drafter.state_dict()}
    assert not stores_frozen_weights(path) and stores_frozen_weights(full)
    config = json.loads((path / "config.json").read_text())
    # SGLang's Eagle3 takes the target's lm_head only when the config's draft vocabulary is null.
    full_config = json.loads((full / "config.json").read_text())
    if variant == "eagle3":
        assert config["draft_vocab_size"] is None and full_config["draft_vocab_size"] == drafter.config.vocab_size
    else:
        assert "draft_vocab_size" not in config and "draft_vocab_size" not in full_config


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_slim_checkpoint_loads_from_the_target_and_computes_the_same(tiny_target, slim, variant):
    drafter, path, _ = slim[variant]
    loaded = load_drafter(path, tiny_target.config, target_model=tiny_target)
    assert loaded.config == drafter.config
    for before, after in zip(outputs(drafter, tiny_target), outputs(loaded, tiny_target)):
        assert torch.equal(before, after)
    assert torch.equal(loaded.lm_head.weight, tiny_target.lm_head.weight)
    frozen = {name for name, p in loaded.named_parameters() if not p.requires_grad}
    assert frozen == set(FROZEN_WEIGHTS)
    # the target model alone is enough: its config is checked
    assert load_drafter(path, target_model=tiny_target).config == drafter.config


def test_slim_checkpoint_without_target_model_is_a_clear_error(tiny_target, slim):
    _, path, _ = slim["dspark_vanilla"]
    with pytest.raises(CheckpointError, match=r"stores no embed_tokens.weight / lm_head.weight.*target_model="):
        load_drafter(path, tiny_target.config)


def test_slim_checkpoint_checks_the_target_model_it_is_given(tiny_target, slim):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    _, path, _ = slim["dflash"]
    other = Qwen3ForCausalLM(Qwen3Config(**{**tiny_target.config.to_dict(), "vocab_size": 80}))
    with pytest.raises(CheckpointError, match="vocab_size is 64, the target's is 80"):
        load_drafter(path, target_model=other)


def test_dspark_check_completes_a_slim_checkpoint_from_the_target(tiny_target, slim, tmp_path, capsys):
    tiny_target.save_pretrained(tmp_path / "target")
    _, path, _ = slim["eagle3"]
    assert main(["check", str(path), "--target", str(tmp_path / "target")]) == 0
    assert "(embed_tokens.weight, lm_head.weight taken from the target)" in capsys.readouterr().out
