"""The committed drafters (embedded/dspark, dflash, eagle3) fit the committed target and draft for it.

Each must load against embedded/target through the same checks serving uses, carry a card, be trained
on the same data and budget as the others, and propose a block for a real prompt.
"""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.checkpoint import load_drafter, stores_frozen_weights
from dspark.models.target_features import capture_target_features
from dspark.models.target_io import target_fingerprint

from tests.paths import EMBEDDED, EMBEDDED_TARGET

KINDS = ("dspark", "dflash", "eagle3")


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET, dtype=torch.float32).eval()


@pytest.mark.parametrize("kind", KINDS)
def test_committed_drafter_fits_the_target_and_proposes_a_block(kind, target):
    assert not stores_frozen_weights(EMBEDDED / kind)  # slim: the target's embedding and lm_head are shared
    drafter = load_drafter(EMBEDDED / kind, target.config, target_model=target, dtype=torch.float32)
    cfg = drafter.config
    assert cfg.kind == kind
    if kind == "dspark":
        assert cfg.markov_rank > 0 and cfg.markov_head_type == "vanilla" and cfg.enable_confidence_head
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    ids = tokenizer("def __init__(self, name):\n        self.", return_tensors="pt").input_ids
    with torch.no_grad():
        features = capture_target_features(target, ids, cfg.target_layer_ids).hidden
    prompt_len = ids.shape[1]
    anchor = target(ids).logits[:, -1].argmax(-1)
    block = drafter.propose(drafter.init_state(1), context_hidden=features, context_tokens=ids,
                            context_lengths=torch.tensor([prompt_len]), anchor=anchor)
    assert block.tokens.shape == (1, cfg.gamma)
    assert (block.confidence() is not None) == (kind == "dspark")


def test_drafters_share_target_data_and_budget_and_have_cards():
    jobs = {kind: json.loads((EMBEDDED / kind / "train_log.json").read_text())["job"] for kind in KINDS}
    same = ("target_sha256", "data_summary", "samples", "seq_len", "steps")
    for field in same:
        assert len({json.dumps(job[field]) for job in jobs.values()}) == 1, field
    assert jobs["dspark"]["target_sha256"] == target_fingerprint(EMBEDDED_TARGET)  # trained on this target
    for kind, job in jobs.items():
        card = (EMBEDDED / kind / "README.md").read_text()
        assert f"{job['steps']} optimizer steps" in card and "dspark train --target embedded/target" in card
        history = json.loads((EMBEDDED / kind / "train_log.json").read_text())["history"]
        assert history[-1]["loss"] < history[0]["loss"], f"{kind}: training did not lower the loss"
