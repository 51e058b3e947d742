"""Target features: the hidden states of chosen target layers, captured the way SGLang captures them.

Layer id l means the raw output of decoder layer l, which is HF `hidden_states[l + 1]` and what SGLang records
"before layer l + 1" (`layers_to_capture = [l + 1 for l in ids]`). The final layer is refused: SGLang has no
"before layer L" capture point, and HF's last `hidden_states` entry is post-final-norm rather than raw.
Features are the concatenation of the chosen layers in `target_layer_ids` order: [bs, seq, n_taps * hidden].
`last_hidden` is the post-final-norm output of the last layer; the target's logits are lm_head(last_hidden).

Capture uses forward hooks on the decoder layers (only the chosen layers are kept, not all of them as
`output_hidden_states` would), so it works under a KV cache during decoding as well as on full sequences.
This replaces DeepSpec's offline cache writer and its online `extract_context_feature`.
"""
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import torch
from torch import nn

from dspark.models.drafters.config import check_target_layer_ids


@dataclass(frozen=True)
class TargetFeatures:
    hidden: torch.Tensor  # [bs, seq, n_taps * hidden] raw outputs of the target_layer_ids layers, concatenated
    last_hidden: torch.Tensor  # [bs, seq, hidden] post-final-norm hidden of the last layer
    past_key_values: Any = None  # the target's cache after this forward (when use_cache)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (or of its base model)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} exposes no decoder `layers` list; cannot tap target layers")
    return layers


class LayerTap:
    """Context manager: while active, records the outputs of the chosen decoder layers of every forward."""

    def __init__(self, model: nn.Module, target_layer_ids: Sequence[int]):
        self.layers = decoder_layers(model)
        check_target_layer_ids(target_layer_ids, len(self.layers))
        self.target_layer_ids = tuple(target_layer_ids)
        self._captured: dict = {}
        self._handles: List[Any] = []

    def __enter__(self) -> "LayerTap":
        for layer_id in self.target_layer_ids:
            self._handles.append(self.layers[layer_id].register_forward_hook(self._recorder(layer_id)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _recorder(self, layer_id: int):
        def record(module, args, output):
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output
        return record

    def pop(self) -> torch.Tensor:
        """The features of the latest forward, [bs, seq, n_taps * hidden]; clears them."""
        missing = [i for i in self.target_layer_ids if i not in self._captured]
        if missing:
            raise RuntimeError(f"no forward has run through target layers {missing} since the last pop()")
        features = torch.cat([self._captured[i] for i in self.target_layer_ids], dim=-1)
        self._captured.clear()
        return features


def capture_target_features(model: nn.Module, input_ids: torch.Tensor, target_layer_ids: Sequence[int], *,
                            attention_mask: Optional[torch.Tensor] = None, **forward_kwargs) -> TargetFeatures:
    """Run the target's base model once and return its features.

    model: a transformers causal LM (e.g. Qwen3ForCausalLM); input_ids: [bs, seq] long; attention_mask:
    [bs, seq] (or [bs, past + seq] with a cache). forward_kwargs go to the base model (past_key_values,
    use_cache, position_ids, ...). Gradients follow the caller's mode; wrap in torch.no_grad() for features only.
    """
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    with LayerTap(model, target_layer_ids) as tap:
        out = base(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
        hidden = tap.pop()
    return TargetFeatures(hidden=hidden, last_hidden=out.last_hidden_state,
                          past_key_values=getattr(out, "past_key_values", None))
