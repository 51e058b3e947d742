"""Tiny drafters for the tiny random target, and its real features, shared by the drafter/checkpoint tests."""
import torch

from dspark.models.drafters import DRAFTER_CLASSES, Drafter, DrafterConfig
from dspark.models.target_features import capture_target_features

LAYER_IDS = (0, 1, 2)
GAMMA = 4
MASK_ID = 1

# name -> DrafterConfig settings; together they cover every head type and both block layouts.
VARIANTS = {
    "dspark_vanilla": dict(kind="dspark", markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True,
                           confidence_head_with_markov=True),
    "dspark_gated": dict(kind="dspark", markov_rank=8, markov_head_type="gated", enable_confidence_head=True),
    "dspark_rnn": dict(kind="dspark", markov_rank=8, markov_head_type="rnn", enable_confidence_head=True,
                       confidence_head_with_markov=True, sample_from_anchor=False),
    "dflash": dict(kind="dflash", sample_from_anchor=False),
    "dflash_anchor": dict(kind="dflash"),
    "eagle3": dict(kind="eagle3"),
}
BLOCK_VARIANTS = [name for name, v in VARIANTS.items() if v["kind"] != "eagle3"]


def make_config(target, variant: str, **overrides) -> DrafterConfig:
    settings = {**VARIANTS[variant], **overrides}
    eagle = settings["kind"] == "eagle3"
    settings.setdefault("num_hidden_layers", 1 if eagle else 2)
    settings.setdefault("mask_token_id", None if eagle else MASK_ID)
    return DrafterConfig.from_target(target.config, block_size=GAMMA, target_layer_ids=LAYER_IDS, **settings)


def make_drafter(target, variant: str, seed: int = 0, std: float = 0.3, **overrides) -> Drafter:
    """A drafter with the target's frozen embedding/head and large random trainable weights.

    The large std (HF's 0.02 makes every draft distribution nearly uniform) lets attention, context and the
    Markov bias visibly change the logits, so the tests below can fail.
    """
    config = make_config(target, variant, **overrides)
    drafter = DRAFTER_CLASSES[config.kind].from_target(target, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.requires_grad and not name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=generator) * std)
    return drafter.eval()


def target_sequence(target, bs: int = 2, seq: int = 16, seed: int = 0):
    """Random token ids [bs, seq] and the target's features for them [bs, seq, n_taps*hidden]."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, target.config.vocab_size, (bs, seq), generator=generator)
    with torch.no_grad():
        features = capture_target_features(target, ids, LAYER_IDS).hidden
    return ids, features
