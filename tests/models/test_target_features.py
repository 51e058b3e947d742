"""Target features equal the outputs of the chosen decoder layers (HF hidden_states[l + 1]), as SGLang taps them."""
import pytest
import torch

from dspark.models.errors import ConfigError
from dspark.models.target_features import LayerTap, capture_target_features, decoder_layers


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))


def test_features_are_the_chosen_layer_outputs_in_order(tiny_target, ids):
    with torch.no_grad():
        features = capture_target_features(tiny_target, ids, [2, 0])
        reference = tiny_target(ids, output_hidden_states=True)
    assert torch.equal(features.hidden, torch.cat([reference.hidden_states[3], reference.hidden_states[1]], -1))
    assert torch.equal(features.last_hidden, reference.hidden_states[-1])  # post final norm
    torch.testing.assert_close(tiny_target.lm_head(features.last_hidden), reference.logits)


def test_features_under_a_kv_cache_match_the_full_sequence(tiny_target, ids):
    with torch.no_grad():
        full = capture_target_features(tiny_target, ids, [0, 1, 2]).hidden
        prefix = capture_target_features(tiny_target, ids[:, :6], [0, 1, 2], use_cache=True)
        step = capture_target_features(tiny_target, ids[:, 6:], [0, 1, 2], past_key_values=prefix.past_key_values,
                                       use_cache=True)
    torch.testing.assert_close(torch.cat([prefix.hidden, step.hidden], 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layer_ids, message", [([3], "final layer 3"), ([0, 4], "outside"), ([-1], "outside")])
def test_layers_sglang_cannot_tap_are_refused(tiny_target, ids, layer_ids, message):
    with pytest.raises(ConfigError, match=message):
        capture_target_features(tiny_target, ids, layer_ids)


def test_hooks_are_removed_after_capture(tiny_target, ids):
    before = [len(layer._forward_hooks) for layer in decoder_layers(tiny_target)]  # transformers keeps its own
    with torch.no_grad():
        capture_target_features(tiny_target, ids, [0, 2])
    assert [len(layer._forward_hooks) for layer in decoder_layers(tiny_target)] == before
    with pytest.raises(RuntimeError, match="no forward"):
        with LayerTap(tiny_target, [1]) as tap:
            tap.pop()
