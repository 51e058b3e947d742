"""Drafter configuration: the target's dimensions plus the drafter's own settings.

A drafter is built for one target. Its transformer dimensions (hidden size, heads, KV heads, head_dim,
intermediate size, RoPE theta, RMSNorm eps, vocab) are a copy of the target's, because the drafter shares
the target's frozen embedding and lm_head and reads the target's hidden states (docs/training.md).
`DrafterConfig.from_target` makes that copy; everything else is the drafter's own choice.

Invariants checked in `__post_init__` (a violation raises `ConfigError` naming field, rule, value, fix):
- `target_layer_ids` are strictly increasing decoder-layer ids in [0, num_target_layers - 2]. Id l taps the
  output of decoder layer l (HF `hidden_states[l + 1]`). The final layer is refused because SGLang captures
  "before layer l + 1", which does not exist for the last layer.
- `kind` fixes the heads: "dspark" has a Markov head (markov_rank > 0, which SGLang's DSPARK requires);
  "dflash" is the same backbone with neither Markov nor confidence head; "eagle3" is the one-layer
  autoregressive drafter (no mask token, no heads).
- `mask_token_id` (dspark/dflash) is a row of the target vocabulary.

`sample_from_anchor` chooses the block layout of dspark/dflash (SGLang's own config key): True feeds
[anchor, MASK x (gamma-1)] and reads gamma outputs from all slots (DeepSpec's layout); False feeds
[anchor, MASK x gamma] and reads slots 1..gamma (the original DFlash layout, the only one SGLang's DFLASH
worker serves). Either way draft k predicts the token at anchor position + k + 1.
"""
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from dspark.models.errors import ConfigError

DRAFTER_KINDS = ("dspark", "dflash", "eagle3")
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
SUPPORTED_ROPE_TYPES = ("default",)
SUPPORTED_ACTIVATIONS = ("silu",)
MAX_LAYERS = 64  # draft layers: a module each, so a config.json must not ask for a million of them
MAX_BLOCK_SIZE = 64  # gamma: verify shapes, unrolled training steps and drafting loops grow with it


@dataclass(frozen=True)
class DrafterConfig:
    kind: str
    # Copied from the target.
    vocab_size: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    num_target_layers: int
    # The drafter's own.
    block_size: int  # gamma: draft tokens proposed per round
    target_layer_ids: Tuple[int, ...]
    num_hidden_layers: int
    mask_token_id: Optional[int] = None
    markov_rank: int = 0
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    sample_from_anchor: bool = True
    initializer_range: float = 0.02

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        _check_choice("kind", self.kind, DRAFTER_KINDS)
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("block_size", self.block_size, minimum=1, maximum=MAX_BLOCK_SIZE)
        _check_int("num_hidden_layers", self.num_hidden_layers, minimum=1, maximum=MAX_LAYERS)
        _check_int("num_target_layers", self.num_target_layers, minimum=2,
                   why="a target needs a layer below its final one to tap")
        _check_int("markov_rank", self.markov_rank, minimum=0)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                              f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs of channels)")
        for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        for name in ("enable_confidence_head", "confidence_head_with_markov", "sample_from_anchor"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        self._check_target_layer_ids()
        self._check_heads()

    @property
    def gamma(self) -> int:
        return self.block_size

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def block_slots(self) -> int:
        """Query slots fed per block: gamma with the anchor as first prediction, else gamma + 1."""
        return self.block_size if self.sample_from_anchor else self.block_size + 1

    def _check_target_layer_ids(self):
        ids = self.target_layer_ids
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ConfigError(f"target_layer_ids must be a non-empty list of ints, got {list(ids)!r}")
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise ConfigError(f"target_layer_ids must be strictly increasing, got {list(ids)}")
        check_target_layer_ids(ids, self.num_target_layers)

    def _check_heads(self):
        _check_choice("markov_head_type", self.markov_head_type, MARKOV_HEAD_TYPES)
        if self.kind == "dspark" and self.markov_rank == 0:
            raise ConfigError("kind='dspark' needs markov_rank > 0 (SGLang's DSPARK refuses a draft without "
                              "a Markov head); use kind='dflash' for the head-less backbone")
        if self.kind != "dspark" and (self.markov_rank or self.enable_confidence_head):
            raise ConfigError(f"kind={self.kind!r} has no Markov or confidence head, got markov_rank="
                              f"{self.markov_rank}, enable_confidence_head={self.enable_confidence_head}; "
                              "set them to 0/False or use kind='dspark'")
        if self.confidence_head_with_markov and not self.enable_confidence_head:
            raise ConfigError("confidence_head_with_markov=True needs enable_confidence_head=True")
        if self.kind == "eagle3":
            if self.num_hidden_layers != 1:
                raise ConfigError(f"kind='eagle3' is the one-layer drafter, got num_hidden_layers="
                                  f"{self.num_hidden_layers}; set it to 1")
            return
        if self.mask_token_id is None:
            raise ConfigError(f"kind={self.kind!r} needs mask_token_id (the token fed at masked block slots); "
                              "reserve one in the tokenizer and pass its id")
        _check_int("mask_token_id", self.mask_token_id, minimum=0)
        if self.mask_token_id >= self.vocab_size:
            raise ConfigError(f"mask_token_id={self.mask_token_id} is outside the vocabulary (vocab_size="
                              f"{self.vocab_size}); use a reserved token id below {self.vocab_size}")

    @classmethod
    def from_target(cls, target_config: Any, *, kind: str, block_size: int, target_layer_ids,
                    num_hidden_layers: int, mask_token_id: Optional[int] = None, **drafter_settings):
        """Copy the target's dimensions from its HF config (or its `text_config`) and add the drafter's."""
        dims = target_dimensions(target_config)
        return cls(kind=kind, block_size=block_size, target_layer_ids=tuple(target_layer_ids),
                   num_hidden_layers=num_hidden_layers, mask_token_id=mask_token_id, **dims, **drafter_settings)


def target_field_reader(target_config: Any) -> Callable[..., Any]:
    """`get(key, default=None)` over a target's HF config, a config object or its dict form.

    Multimodal configs keep the language model's fields in their text config, which is the one read.
    """
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    if isinstance(text, dict):
        return text.get
    return lambda key, default=None: getattr(text, key, default)


def target_dimensions(target_config: Any) -> dict:
    """The target fields a drafter copies, read from its HF config; refuses what the drafters cannot copy."""
    get = target_field_reader(target_config)
    rope = get("rope_parameters") or get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"target rope_type={rope_type!r} is not supported by the drafters "
                          f"(supported: {SUPPORTED_ROPE_TYPES}); use a target with plain RoPE")
    activation = get("hidden_act", "silu")
    if activation not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(f"target hidden_act={activation!r} is not supported (supported: {SUPPORTED_ACTIVATIONS})")
    if get("attention_bias", False):
        raise ConfigError("target attention_bias=True is not supported; the drafters' projections have no bias")
    heads = get("num_attention_heads")
    if type(heads) is not int or heads < 1:
        raise ConfigError(f"target num_attention_heads must be an integer >= 1, got {str(heads)[:40]}")
    rope_theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    return dict(
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        num_attention_heads=heads,
        num_key_value_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or get("hidden_size") // heads,
        intermediate_size=get("intermediate_size"),
        rope_theta=rope_theta if rope_theta is not None else get("rope_theta", 10000.0),
        rms_norm_eps=get("rms_norm_eps", 1e-6),
        max_position_embeddings=get("max_position_embeddings", 32768),
        num_target_layers=get("num_hidden_layers"),
    )


def check_target_layer_ids(layer_ids, num_target_layers: int) -> None:
    """Refuse ids that are negative, out of range, or the final layer (SGLang captures before layer l + 1)."""
    last = num_target_layers - 1
    for i in layer_ids:
        if i < 0 or i > last:
            raise ConfigError(f"target_layer_ids contains {i}, outside the target's decoder layers "
                              f"0..{last} (num_hidden_layers={num_target_layers}); pick ids in 0..{last - 1}")
        if i == last:
            raise ConfigError(f"target_layer_ids contains the final layer {last}: SGLang captures the hidden "
                              f"state before layer l + 1, which does not exist for the last layer (and HF's "
                              f"last hidden_states entry is post-norm); pick ids in 0..{last - 1}")


def _check_int(name: str, value: Any, *, minimum: int, maximum: Optional[int] = None, why: str = "") -> None:
    too_large = maximum is not None and isinstance(value, int) and value > maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or too_large:
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        reason = f" ({why})" if why else ""
        raise ConfigError(f"{name} must be an integer {bound}{reason}, got {value!r}")


def _check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
