"""Drafter checkpoints: exact round trip, the chosen HF layout, and a named error for every misfit."""
import json

import pytest
import torch

from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from dspark.kernels.warping import SamplingParams
from dspark.models.checkpoint import ARCH_DFLASH, ARCH_DSPARK, ARCH_EAGLE3, load_drafter, save_drafter
from dspark.models.errors import CheckpointError
from tests.models.drafters.drafter_helpers import GAMMA, VARIANTS, make_drafter, target_sequence

ARCHITECTURES = {"dspark_vanilla": ARCH_DSPARK, "dspark_gated": ARCH_DSPARK, "dspark_rnn": ARCH_DSPARK,
                 "dflash": ARCH_DFLASH, "dflash_anchor": ARCH_DSPARK, "eagle3": ARCH_EAGLE3}


def outputs(drafter, target):
    """Training and drafting outputs of a drafter on fixed inputs."""
    ids, features = target_sequence(target, bs=2, seq=12)
    with torch.no_grad():
        if drafter.config.kind == "eagle3":
            train = [drafter.forward_train(features, ids, torch.ones(2, 12), ttt_steps=3)]
        else:
            out = drafter.forward_train(features, ids, torch.tensor([[1, 6], [3, 0]]), torch.tensor([[1, 1], [1, 0]]).bool())
            train = [out.draft_logits] + ([] if out.confidence_logits is None else [out.confidence_logits])
    block = drafter.propose(drafter.init_state(2), context_hidden=features[:, :5], context_tokens=ids[:, :5],
                            context_lengths=torch.tensor([5, 3]), anchor=ids[:, 5], sampling=SamplingParams(0.8),
                            generator=torch.Generator().manual_seed(0))
    return train + [block.tokens, block.logits] + ([] if block.confidence_logits is None else [block.confidence_logits])


@pytest.fixture(scope="module")
def saved(tiny_target, tmp_path_factory):
    """variant -> (drafter, checkpoint directory)."""
    root = tmp_path_factory.mktemp("drafters")
    return {name: (drafter, save_drafter(drafter, root / name))
            for name, drafter in ((v, make_drafter(tiny_target, v)) for v in VARIANTS)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_round_trip_is_bit_identical(tiny_target, saved, variant):
    drafter, path = saved[variant]
    loaded = load_drafter(path, tiny_target.config)
    assert type(loaded) is type(drafter) and loaded.config == drafter.config
    for before, after in zip(outputs(drafter, tiny_target), outputs(loaded, tiny_target)):
        assert torch.equal(before, after)
    frozen = {name for name, p in loaded.named_parameters() if not p.requires_grad}
    assert frozen == {"embed_tokens.weight", "lm_head.weight"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_layout_is_the_sglang_one(saved, variant):
    drafter, path = saved[variant]
    config = json.loads((path / "config.json").read_text())
    names = set(load_file(str(path / "model.safetensors")))
    assert config["architectures"] == [ARCHITECTURES[variant]]
    assert {"fc.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight"} <= names
    if variant == "eagle3":
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
        assert "midlayer.self_attn.q_proj.weight" in names and "midlayer.hidden_norm.weight" in names
        return
    assert config["block_size"] == (GAMMA + 1 if variant == "dflash" else GAMMA)
    assert config["target_layer_ids"] == [0, 1, 2] and config["mask_token_id"] == 1
    assert {"hidden_norm.weight", "layers.1.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight"} <= names
    settings = VARIANTS[variant]
    for key in ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"):
        assert config[key] == settings.get(key, drafter.config.__dict__[key])
    if settings.get("markov_rank"):
        assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                "confidence_head.proj.bias"} <= names
        extra = {"gated": "markov_head.gate_proj.weight", "rnn": "markov_head.joint_proj.weight"}
        assert extra.get(settings["markov_head_type"], "markov_head.markov_w1.weight") in names


def other_target(tiny_target, **changes):
    settings = {key: value for key, value in tiny_target.config.to_dict().items() if key != "layer_types"}
    return Qwen3Config(**{**settings, **changes})


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_size=48), "hidden_size is 32, the target's is 48"),
    (dict(vocab_size=128), "vocab_size is 64, the target's is 128"),
    (dict(num_hidden_layers=3), "contains 2, the target's final layer"),
    (dict(num_hidden_layers=2), "contains 2, outside the target's layers 0..1"),
])
def test_a_checkpoint_that_does_not_fit_the_target_names_the_mismatch(tiny_target, saved, changes, message):
    with pytest.raises(CheckpointError, match=message):
        load_drafter(saved["dspark_vanilla"][1], other_target(tiny_target, **changes))


def test_mask_token_outside_the_target_vocab(tiny_target, saved, tmp_path):
    with pytest.raises(CheckpointError, match="mask_token_id 1 is outside the target's vocab"):
        load_drafter(saved["dflash"][1], other_target(tiny_target, vocab_size=1))
    path = copy_checkpoint(saved["dflash"][1], tmp_path, mask_token_id=64)
    with pytest.raises(CheckpointError, match="mask_token_id=64 is outside the vocabulary"):
        load_drafter(path, tiny_target.config)


def copy_checkpoint(source, directory, tensors=None, **config_changes):
    config = {**json.loads((source / "config.json").read_text()), **config_changes}
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors if tensors is not None else load_file(str(source / "model.safetensors")),
              str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("hidden_norm.weight"), r"missing weights \['hidden_norm.weight'\]"),
    (lambda t: t.update(extra=torch.zeros(2)), r"unexpected weights \['extra'\]"),
    (lambda t: t.update({"fc.weight": torch.zeros(32, 64)}), r"fc.weight is \(32, 64\), expected \(32, 96\)"),
    (lambda t: t.pop("markov_head.markov_w2.weight"), "missing weights"),
    (lambda t: t.update({"markov_head.markov_w1.weight": torch.tensor(1.0)}), "markov_w1.weight must be a table"),
])
def test_weights_that_do_not_match_the_config_are_named(tiny_target, saved, tmp_path, edit, message):
    tensors = load_file(str(saved["dspark_vanilla"][1] / "model.safetensors"))
    edit(tensors)
    with pytest.raises(CheckpointError, match=message):
        load_drafter(copy_checkpoint(saved["dspark_vanilla"][1], tmp_path, tensors), tiny_target.config)


@pytest.mark.parametrize("changes, message", [
    (dict(intermediate_size=10 ** 13), r"mlp.gate_proj.weight is \(\d+, \d+\), expected \(10000000000000, "),
    (dict(num_hidden_layers=10 ** 6), r"num_hidden_layers must be an integer in \[1, 64\], got 1000000"),
    (dict(num_attention_heads=10 ** 9, num_key_value_heads=10 ** 9), "wrong shapes"),
])
def test_a_config_asking_for_more_than_its_weights_is_refused_before_allocating(tiny_target, saved, tmp_path, changes,
                                                                                 message):
    """Shapes are compared on the meta device: terabytes that config.json asks for are never allocated."""
    with pytest.raises(CheckpointError, match=message):
        load_drafter(copy_checkpoint(saved["dspark_vanilla"][1], tmp_path, **changes), tiny_target.config)


@pytest.mark.parametrize("changes, message", [
    (dict(architectures=["LlamaForCausalLM"]), "not a dspark drafter checkpoint"),
    (dict(target_layer_ids=None), "required field 'target_layer_ids' is missing"),
    (dict(block_size="4"), "block_size must be a int"),
    (dict(markov_head_type="lstm"), "markov_head_type must be one of"),
    (dict(enable_confidence_head="yes"), "enable_confidence_head must be true or false"),
    (dict(dflash_config=[1]), "dflash_config must be a JSON object"),
])
def test_malformed_config_json_is_refused(saved, tmp_path, changes, message):
    with pytest.raises(CheckpointError, match=message):
        load_drafter(copy_checkpoint(saved["dspark_vanilla"][1], tmp_path, **changes))


def test_unreadable_files_are_refused(saved, tmp_path):
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_drafter(tmp_path)
    path = copy_checkpoint(saved["eagle3"][1], tmp_path)
    for text in ("{not json", "[" * 100_000, '{"block_size": 1' + "0" * 5000 + "}"):
        (path / "config.json").write_text(text)
        problem = r"config.json is not a drafter config JSON \((JSONDecodeError|RecursionError|ValueError)\)"
        with pytest.raises(CheckpointError, match=problem):
            load_drafter(path)
    copy_checkpoint(saved["eagle3"][1], tmp_path)
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot be read as safetensors"):
        load_drafter(path)
    save_file({"step": torch.tensor([1])}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="holds no floating-point tensor"):
        load_drafter(path)
