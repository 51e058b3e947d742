"""DrafterConfig copies the target's dimensions and refuses invalid settings with a ConfigError that says why."""
import dataclasses

import pytest
from transformers import Qwen3Config

from dspark.models.drafters import DrafterConfig
from dspark.models.errors import ConfigError


def dspark_config(target_config, **overrides):
    settings = dict(kind="dspark", block_size=4, target_layer_ids=[0, 1, 2], num_hidden_layers=2, mask_token_id=1,
                    markov_rank=8)
    return DrafterConfig.from_target(target_config, **{**settings, **overrides})


def test_copies_target_dimensions(tiny_target):
    target = tiny_target.config
    config = dspark_config(target)
    assert (config.vocab_size, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.intermediate_size, config.num_target_layers) == \
           (target.vocab_size, target.hidden_size, target.num_attention_heads, target.num_key_value_heads,
            target.head_dim, target.intermediate_size, target.num_hidden_layers)
    assert config.rope_theta == target.rope_parameters["rope_theta"]
    assert config.rms_norm_eps == target.rms_norm_eps
    assert config.gamma == 4 and config.num_taps == 3 and config.block_slots == 4
    assert dataclasses.replace(config, sample_from_anchor=False).block_slots == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size = 5


@pytest.mark.parametrize("overrides, message", [
    (dict(target_layer_ids=[0, 3]), "final layer 3"),
    (dict(target_layer_ids=[0, 7]), "outside the target's decoder layers"),
    (dict(target_layer_ids=[-1, 0]), "outside the target's decoder layers"),
    (dict(target_layer_ids=[1, 0]), "strictly increasing"),
    (dict(target_layer_ids=[]), "non-empty"),
    (dict(mask_token_id=64), "mask_token_id=64 is outside the vocabulary"),
    (dict(mask_token_id=None), "needs mask_token_id"),
    (dict(markov_rank=0), "needs markov_rank > 0"),
    (dict(markov_head_type="lstm"), "markov_head_type must be one of"),
    (dict(block_size=0), r"block_size must be an integer in \[1, 64\], got 0"),
    (dict(confidence_head_with_markov=True), "needs enable_confidence_head=True"),
    (dict(kind="dflash"), "has no Markov or confidence head"),
    (dict(kind="eagle3", markov_rank=0), "one-layer drafter"),
    (dict(kind="medusa"), "kind must be one of"),
    (dict(sample_from_anchor="yes"), "sample_from_anchor must be true or false"),
])
def test_invalid_settings_are_refused(tiny_target, overrides, message):
    with pytest.raises(ConfigError, match=message):
        dspark_config(tiny_target.config, **overrides)


def test_unsupported_target_features_are_refused(tiny_target):
    target = tiny_target.config.to_dict()
    with pytest.raises(ConfigError, match="rope_type"):
        dspark_config(Qwen3Config(**{**target, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
                                                                     "factor": 2.0, "original_max_position_embeddings": 64}}))
    with pytest.raises(ConfigError, match="hidden_act"):
        dspark_config(Qwen3Config(**{**target, "hidden_act": "gelu"}))
    with pytest.raises(ConfigError, match="num_attention_heads must be an integer >= 1, got 0"):
        dspark_config({**target, "num_attention_heads": 0, "head_dim": None})
