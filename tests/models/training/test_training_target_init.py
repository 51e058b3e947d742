"""init_from_target: draft layers are the target's top layers and fc passes the deepest tapped layer through."""
import torch
from training_helpers import build_tiny_target, make_drafter_and_task

from dspark.models.target_features import capture_target_features
from dspark.models.training.target_init import init_from_target


def test_block_drafter_starts_as_the_targets_top_layers():
    target = build_tiny_target(layers=4)
    drafter, _ = make_drafter_and_task("dspark", target, layer_ids=(0, 1, 2))  # 1 draft layer
    markov_before = {k: v.clone() for k, v in drafter.markov_head.state_dict().items()}
    init_from_target(drafter, target)
    top = target.model.layers[3]
    for name, value in top.named_parameters():
        assert torch.equal(dict(drafter.layers[0].named_parameters())[name], value), name
    assert torch.equal(drafter.hidden_norm.weight, top.input_layernorm.weight)
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    for name, value in drafter.markov_head.state_dict().items():
        assert torch.equal(value, markov_before[name]), "the heads keep their own init"


def test_fc_passes_the_deepest_tap_through():
    target = build_tiny_target(layers=4)
    drafter, _ = make_drafter_and_task("dflash", target, layer_ids=(0, 1, 2))
    init_from_target(drafter, target)
    ids = torch.randint(2, 64, (2, 9))
    features = capture_target_features(target, ids, (0, 1, 2)).hidden
    deepest = capture_target_features(target, ids, (2,)).hidden
    assert torch.allclose(drafter.fc(features), deepest, atol=1e-6)


def test_eagle3_reads_the_hidden_half_with_the_targets_projections():
    target = build_tiny_target(layers=4)
    drafter, _ = make_drafter_and_task("eagle3", target, layer_ids=(0, 1, 2))
    embed_half = drafter.midlayer.self_attn.q_proj.weight[:, :32].clone()
    init_from_target(drafter, target)
    top, mid = target.model.layers[3], drafter.midlayer
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(mid.self_attn, name).weight[:, 32:], getattr(top.self_attn, name).weight)
    assert torch.equal(mid.self_attn.q_proj.weight[:, :32], embed_half), "the embedding half keeps its init"
    assert torch.equal(mid.mlp.down_proj.weight, top.mlp.down_proj.weight)
    assert torch.equal(mid.hidden_norm.weight, top.input_layernorm.weight)
