"""The committed SmolLM2 drafters are slim and fit the provided target: two equal-budget trios, 1000 steps
(embedded/smollm2-{dspark,dflash,eagle3}) and the longer recipe (embedded/smollm2-{dspark,dflash,eagle3}-long),
the longer recipe's DSpark fine-tuned on self-chat prompts (embedded/smollm2-dspark-chat), and that one trained
further with its loss over its draft vocabulary (embedded/smollm2-dspark-chat-vocab), then on fresh replies
(embedded/smollm2-dspark-chat-more), then on the target's greedy replies (embedded/smollm2-dspark-chat-greedy).

The files are checked everywhere (slim, cards, each trio's same data and budget); loading them and proposing a block
needs the SmolLM2 directory `make setup` provides, and is skipped, with the reason, where it is missing.
"""
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.cache import cache_root
from dspark.models.checkpoint import FROZEN_WEIGHTS, load_drafter, stores_frozen_weights
from dspark.models.targets.smollm2 import is_provided, target_dir
from dspark.models.target_features import capture_target_features
from dspark.models.target_io import target_fingerprint

from tests.paths import EMBEDDED

KINDS = ("dspark", "dflash", "eagle3")
EQUAL_BUDGET_TRIOS = {"1000 steps": KINDS, "longer recipe": tuple(f"{kind}-long" for kind in KINDS)}
FINE_TUNED = {"dspark-chat": ("dspark", "embedded/smollm2-dspark-long"),  # dir suffix -> (kind, started from)
              "dspark-chat-vocab": ("dspark", "embedded/smollm2-dspark-chat"),
              "dspark-chat-more": ("dspark", "embedded/smollm2-dspark-chat-vocab"),
              "dspark-chat-greedy": ("dspark", "embedded/smollm2-dspark-chat-more")}
DRAFTERS = {name: kind for trio in EQUAL_BUDGET_TRIOS.values() for name, kind in zip(trio, KINDS)}  # dir suffix -> kind
DRAFTERS.update({name: kind for name, (kind, _) in FINE_TUNED.items()})
SMOLLM2 = target_dir(cache_root())
MAX_COMMITTED_MB = 40


def _dir(name: str) -> Path:
    return EMBEDDED / f"smollm2-{name}"


@pytest.mark.parametrize("name", DRAFTERS)
def test_committed_smollm2_drafter_is_slim_and_small(name):
    assert not stores_frozen_weights(_dir(name))
    with safe_open(str(_dir(name) / "model.safetensors"), framework="pt") as handle:
        assert not set(FROZEN_WEIGHTS) & set(handle.keys())
    assert (_dir(name) / "model.safetensors").stat().st_size < MAX_COMMITTED_MB * 2**20


@pytest.mark.parametrize("trio", EQUAL_BUDGET_TRIOS)
def test_smollm2_trio_shares_data_and_budget(trio):
    names = EQUAL_BUDGET_TRIOS[trio]
    jobs = {name: json.loads((_dir(name) / "train_log.json").read_text())["job"] for name in names}
    for field in ("target_sha256", "data_summary", "samples", "seq_len", "trained_tokens", "steps"):
        assert len({json.dumps(job[field]) for job in jobs.values()}) == 1, field


@pytest.mark.parametrize("name", FINE_TUNED)
def test_a_fine_tuned_drafter_records_where_it_started(name):
    job = json.loads((_dir(name) / "train_log.json").read_text())["job"]
    started_from = FINE_TUNED[name][1]
    assert job["init_from_drafter"] == started_from and not job["init_from_target"]
    assert f"the trained drafter {started_from} (--init-from-drafter)" in (_dir(name) / "README.md").read_text()


@pytest.mark.parametrize("name", DRAFTERS)
def test_smollm2_drafter_has_a_card_and_a_finished_run(name):
    log = json.loads((_dir(name) / "train_log.json").read_text())
    job = log["job"]
    assert job["slim"] and not job["stopped_early"]
    card = (_dir(name) / "README.md").read_text()
    assert f"{job['steps']} optimizer steps" in card and "--data-source chat" in card and "--slim" in card
    assert log["history"][-1]["loss"] < log["history"][0]["loss"], f"{name}: training did not lower the loss"


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(str(SMOLLM2), dtype=torch.float32).eval()


@pytest.mark.skipif(not is_provided(SMOLLM2), reason=f"{SMOLLM2} not provided: run make setup")
@pytest.mark.parametrize("name,kind", DRAFTERS.items())
def test_committed_smollm2_drafter_loads_from_the_target_and_proposes(name, kind, target):
    job = json.loads((_dir(name) / "train_log.json").read_text())["job"]
    assert job["target_sha256"] == target_fingerprint(SMOLLM2)
    drafter = load_drafter(_dir(name), target.config, target_model=target, dtype=torch.float32)
    cfg = drafter.config
    assert cfg.kind == kind and torch.equal(drafter.lm_head.weight, target.lm_head.weight)
    tokenizer = AutoTokenizer.from_pretrained(str(SMOLLM2))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Name three primary colors."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        features = capture_target_features(target, ids, cfg.target_layer_ids).hidden
        anchor = target(ids).logits[:, -1].argmax(-1)
    block = drafter.propose(drafter.init_state(1), context_hidden=features, context_tokens=ids,
                            context_lengths=torch.tensor([ids.shape[1]]), anchor=anchor)
    assert block.tokens.shape == (1, cfg.gamma)
    assert (block.confidence() is not None) == (kind == "dspark")
