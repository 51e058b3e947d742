"""SGLang 0.5.23's own code accepts our drafter checkpoints (run on CPU in a separate process: sglang_probe.py).

For each checkpoint, SGLang's config parser for its algorithm accepts config.json; SGLang's draft class
(Qwen3DSparkModel, DFlashDraftModel, LlamaForCausalLMEagle3) is built, all its parameters are set to NaN, and
its `load_weights` reads our safetensors: every parameter must come back equal to what we wrote, and every
weight we wrote must land in a parameter (except the embedding/lm_head copies SGLang replaces with the
target's own). The pieces SGLang can run without a batch must compute what ours compute. A checkpoint with a
renamed weight shows the check catches what SGLang silently skips.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark.models.checkpoint import save_drafter
from dspark.models.drafters.draft_vocab import save_draft_vocab
from tests.models.drafters.drafter_helpers import GAMMA, make_drafter

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("sglang_probe.py")
PROBE_TIMEOUT_S = 600
CASES = {  # checkpoint -> (our variant, SGLang algorithm family)
    "dspark_vanilla": ("dspark_vanilla", "dspark"),
    "dspark_gated": ("dspark_gated", "dspark"),
    "dspark_rnn": ("dspark_rnn", "dspark"),
    "dflash": ("dflash", "dflash"),
    "eagle3": ("eagle3", "eagle3"),
}
SERVED = list(CASES)
SLIM = ("dspark_vanilla", "dflash", "eagle3")
EAGLE3_DRAFT_VOCAB = list(range(3, 64, 5))  # of the tiny target's 64 tokens
NUMERICS_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def report(tiny_target, tmp_path_factory):
    work = tmp_path_factory.mktemp("sglang_probe")
    tiny_target.save_pretrained(work / "target")
    cases = {}
    for name, (variant, family) in CASES.items():
        save_drafter(make_drafter(tiny_target, variant), work / name)
        cases[name] = {"family": family, "numerics": True}
    # DeepSpec's DFlash layout (anchor as first prediction) is saved as Qwen3DSparkModel with markov_rank 0.
    save_drafter(make_drafter(tiny_target, "dflash_anchor"), work / "dflash_anchor")
    cases["dflash_anchor"] = {"family": "dspark", "numerics": False}
    # Slim checkpoints (no frozen embedding / lm_head copies): SGLang must take both from the target.
    for name in SLIM:
        save_drafter(make_drafter(tiny_target, CASES[name][0]), work / f"{name}_slim", frozen=False)
        cases[f"{name}_slim"] = {"family": CASES[name][1], "numerics": False}
    # A compact Eagle3 (trained over a draft vocabulary): SGLang's own layout, its head rows and d2t.
    compact = save_drafter(make_drafter(tiny_target, "eagle3"), work / "eagle3_draft_vocab", frozen=False,
                           draft_vocab=torch.tensor(EAGLE3_DRAFT_VOCAB))
    save_draft_vocab(compact, torch.tensor(EAGLE3_DRAFT_VOCAB), source="test", counted_tokens=1, coverage=1.0)
    cases["eagle3_draft_vocab"] = {"family": "eagle3", "numerics": False}
    # Negative control: a weight under a name SGLang does not know.
    renamed = work / "dspark_renamed"
    save_drafter(make_drafter(tiny_target, "dspark_vanilla"), renamed)
    tensors = load_file(str(renamed / "model.safetensors"))
    tensors["hidden_nrm.weight"] = tensors.pop("hidden_norm.weight")
    save_file(tensors, str(renamed / "model.safetensors"))
    cases["dspark_renamed"] = {"family": "dspark", "numerics": False}
    (work / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", SGLANG_RAGGED_VERIFY_MODE="cap-accept")
    done = subprocess.run([sys.executable, str(PROBE), str(work)], env=env, capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    assert done.returncode == 0, f"sglang_probe.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    return json.loads((work / "report.json").read_text())


@pytest.mark.parametrize("name", SERVED)
def test_sglang_parses_our_config(report, name):
    parsed = report[name]["config"]
    if name == "eagle3":
        assert parsed == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    elif name == "dflash":  # SGLang's DFLASH block counts the anchor slot
        assert parsed == {"block_size": GAMMA + 1, "target_layer_ids": [0, 1, 2], "mask_token_id": 1}
    else:
        assert parsed == {"gamma": GAMMA, "mask_token_id": 1}


@pytest.mark.parametrize("name", SERVED)
def test_sglang_loads_every_weight_we_write_into_every_parameter_it_owns(report, name):
    case = report[name]
    assert case["sglang_params"], "SGLang built a model without parameters"
    assert case["unfilled"] == [], "SGLang parameters our checkpoint does not provide"
    assert case["mismatched"] == [], "SGLang parameters loaded with other values than ours"
    assert case["unconsumed"] == [], "weights of ours SGLang does not load"
    if name.startswith("dspark"):
        assert any(p.startswith("confidence_head.") for p in case["sglang_params"])
        assert any(p.startswith("markov_head.") for p in case["sglang_params"])


@pytest.mark.parametrize("name", SERVED)
def test_sglang_computes_what_we_compute(report, name):
    numerics = report[name]["numerics"]
    assert numerics and all(err <= NUMERICS_TOLERANCE for err in numerics.values()), numerics


def test_the_weight_check_catches_a_weight_sglang_skips(report):
    assert report["dspark_renamed"]["unfilled"] == ["hidden_norm.weight"]
    assert report["dspark_renamed"]["unconsumed"] == ["hidden_nrm.weight"]


def test_sglang_dspark_refuses_deepspec_layout_dflash(report):
    assert "markov_rank > 0" in report["dflash_anchor"]["config_error"]


@pytest.mark.parametrize("name", SLIM)
def test_sglang_serves_slim_checkpoints_with_the_targets_embedding_and_head(report, name):
    slim, full = report[f"{name}_slim"], report[name]
    assert slim["config"] == full["config"]
    assert slim["mismatched"] == [] and slim["unconsumed"] == []
    if name == "eagle3":  # the worker's set_embed_and_head fills exactly these two from the target
        assert slim["unfilled"] == ["lm_head.weight", "model.embed_tokens.weight"]
        assert slim["load_lm_head_from_target"] is True and full["load_lm_head_from_target"] is False
    else:  # the block drafters own no embedding / head parameters in SGLang: they attach the target's
        assert slim["unfilled"] == [] and slim["sglang_params"] == full["sglang_params"]


def test_sglang_serves_a_compact_eagle3_over_its_draft_vocabulary(report):
    case = report["eagle3_draft_vocab"]
    assert case["mismatched"] == [] and case["unconsumed"] == []
    # the worker's set_embed fills the embedding from the target; the head is the checkpoint's draft rows
    assert case["unfilled"] == ["model.embed_tokens.weight"] and case["load_lm_head_from_target"] is False
    assert case["hot_token_id"] == EAGLE3_DRAFT_VOCAB
