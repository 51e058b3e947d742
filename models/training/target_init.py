"""Start a drafter from the target's own top layers instead of a random init (`dspark train --init-from-target`).

A drafter's layers have the target's dimensions and the Qwen3/Llama parameter names, and its context is the
target's deepest tapped feature, the input of the target's layers above the tap. So, before any training:

- `fc` passes the deepest tapped layer through (identity on its slice of the concatenated features, zero on the
  others): the context starts as the target's own hidden state there;
- DSpark/DFlash: draft layer i takes the weights of target layer L - n + i (the top n of its L layers, which
  for SmolLM2 with taps [2, 15, 27] and n = 2 are exactly layers 28 and 29 above the deepest tap),
  `hidden_norm` the input norm of the first of them (the norm that layer applies to the tapped stream) and
  `norm` the target's final norm, so a draft slot reads the target's head the way the target does. q/k norms
  the target lacks (Llama) stay at their ones;
- Eagle3: its one layer reads [embed ; hidden] (2*hidden wide); the hidden half of q/k/v_proj, o_proj, the
  MLP and its norms take the top target layer's weights (`hidden_norm` its input norm; the embedding half of
  q/k/v keeps its random init), `norm` the final norm.

The Markov and confidence heads keep their random init: the target has nothing like them.
"""
from __future__ import annotations

import torch
from torch import nn

from dspark.models.drafters import Drafter
from dspark.models.target_features import decoder_layers

ATTENTION = ("q_proj", "k_proj", "v_proj")


@torch.no_grad()
def init_from_target(drafter: Drafter, target: nn.Module) -> None:
    """Copy the target's top layers, final norm and a pass-through `fc` into `drafter` (module docstring)."""
    layers = decoder_layers(target)
    cfg = drafter.config
    pass_deepest_tap(drafter.fc, cfg.num_taps, cfg.hidden_size)
    drafter.norm.weight.copy_(target.get_decoder().norm.weight)
    if cfg.kind == "eagle3":
        init_eagle3_layer(drafter.midlayer, layers[-1], cfg.hidden_size)
        return
    top = layers[len(layers) - len(drafter.layers):]
    drafter.hidden_norm.weight.copy_(top[0].input_layernorm.weight)
    for draft_layer, target_layer in zip(drafter.layers, top):
        copy_matching(draft_layer, target_layer)


def pass_deepest_tap(fc: nn.Linear, num_taps: int, hidden: int) -> None:
    """fc.weight [hidden, num_taps*hidden] = [0 ... 0 | I]: the last (deepest) tap passes through unchanged."""
    fc.weight.zero_()
    fc.weight[:, (num_taps - 1) * hidden:] = torch.eye(hidden, dtype=fc.weight.dtype)


def copy_matching(dst: nn.Module, src: nn.Module) -> None:
    """Copy every parameter of `src` whose name and shape `dst` shares; a missing or differently shaped one stays."""
    own = dict(dst.named_parameters())
    for name, value in src.named_parameters():
        if name in own and own[name].shape == value.shape:
            own[name].copy_(value)


def init_eagle3_layer(midlayer: nn.Module, target_layer: nn.Module, hidden: int) -> None:
    """The target layer's weights where Eagle3's layer has their shape; q/k/v read the hidden half of their input."""
    copy_matching(midlayer, target_layer)
    midlayer.hidden_norm.weight.copy_(target_layer.input_layernorm.weight)
    for name in ATTENTION:
        getattr(midlayer.self_attn, name).weight[:, hidden:] = getattr(target_layer.self_attn, name).weight
