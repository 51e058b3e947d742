"""The committed SmolLM2 drafter (embedded/smollm2-dspark-regen, the demo's) is slim, compact and fits the
provided target; the drafters it descends from are retired to records that keep their numbers.

The files are checked everywhere (slim, compact, card, finished run); loading it and proposing a block needs the
SmolLM2 directory `make setup` provides, and is skipped, with the reason, where it is missing.
"""
import gzip
import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.cache import cache_root
from dspark.models.checkpoint import DRAFT_VOCAB_ROWS, FROZEN_WEIGHTS, is_compact, load_drafter, stores_frozen_weights
from dspark.models.drafters.draft_vocab import load_draft_vocab
from dspark.models.targets.smollm2 import is_provided, target_dir
from dspark.models.target_features import capture_target_features
from dspark.models.target_io import target_fingerprint

from tests.paths import EMBEDDED, REPO

DEMO_DRAFTER = EMBEDDED / "smollm2-dspark-regen"
RETIRED = REPO / "bench" / "results" / "retired-drafters"
SMOLLM2 = target_dir(cache_root())
VOCAB_SIZE = 49152


def test_demo_drafter_is_slim_and_compact():
    assert not stores_frozen_weights(DEMO_DRAFTER) and is_compact(DEMO_DRAFTER)
    draft_vocab = load_draft_vocab(DEMO_DRAFTER, VOCAB_SIZE)
    with safe_open(str(DEMO_DRAFTER / "model.safetensors"), framework="pt") as handle:
        assert not set(FROZEN_WEIGHTS) & set(handle.keys())
        assert {handle.get_slice(name).get_shape()[0] for name in DRAFT_VOCAB_ROWS} == {len(draft_vocab)}
    assert (DEMO_DRAFTER / "model.safetensors").stat().st_size < 20 * 2**20


def test_demo_drafter_has_a_card_and_a_finished_run():
    log = json.loads((DEMO_DRAFTER / "train_log.json").read_text())
    job = log["job"]
    assert job["slim"] and job["loss_over_draft_vocab"] and not job["stopped_early"]
    card = (DEMO_DRAFTER / "README.md").read_text()
    assert f"{job['steps']} optimizer steps" in card and "--data " in card and "--slim" in card
    assert "## Stored compactly" in card
    # Thirds, not the first and last window: a fine-tune starts low, and one 10-step window of 40 samples is noisy.
    losses = [entry["loss"] for entry in log["history"]]
    third = len(losses) // 3
    assert third and sum(losses[-third:]) < sum(losses[:third]), "training did not lower the loss"


def test_retired_drafters_keep_their_cards_and_logs():
    records = sorted(path.name for path in RETIRED.iterdir())
    assert records and all(name.startswith("smollm2-") for name in records)
    for name in records:
        log = json.loads(gzip.decompress((RETIRED / name / "train_log.json.gz").read_bytes()))  # gzip: the tree bound
        assert f"{log['job']['steps']} optimizer steps" in (RETIRED / name / "README.md").read_text(), name
        assert not list((RETIRED / name).glob("*.safetensors")), f"{name}: a retired drafter keeps no weights"


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(str(SMOLLM2), dtype=torch.float32).eval()


@pytest.mark.skipif(not is_provided(SMOLLM2), reason=f"{SMOLLM2} not provided: run make setup")
def test_demo_drafter_loads_from_the_target_and_proposes(target):
    job = json.loads((DEMO_DRAFTER / "train_log.json").read_text())["job"]
    assert job["target_sha256"] == target_fingerprint(SMOLLM2)
    drafter = load_drafter(DEMO_DRAFTER, target.config, target_model=target, dtype=torch.float32)
    cfg = drafter.config
    assert cfg.kind == "dspark" and torch.equal(drafter.lm_head.weight, target.lm_head.weight)
    outside = torch.ones(VOCAB_SIZE, dtype=torch.bool)
    outside[load_draft_vocab(DEMO_DRAFTER, VOCAB_SIZE)] = False
    assert not drafter.markov_head.markov_w2.weight[outside].any()  # zeros outside the draft vocabulary
    tokenizer = AutoTokenizer.from_pretrained(str(SMOLLM2))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Name three primary colors."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        features = capture_target_features(target, ids, cfg.target_layer_ids).hidden
        anchor = target(ids).logits[:, -1].argmax(-1)
    block = drafter.propose(drafter.init_state(1), context_hidden=features, context_tokens=ids,
                            context_lengths=torch.tensor([ids.shape[1]]), anchor=anchor)
    assert block.tokens.shape == (1, cfg.gamma) and block.confidence() is not None
