"""Drafters from every trainer: each layout is named, converted into the one SGLang serves, and decodes as trained.

The foreign layouts are written here from the committed drafters, each the way its trainer documents it (the writers
below follow the trainers' own docs and code, not models/checkpoint_convert.py), into temporary directories:
- speculators: speculators_model_type, the dims in transformer_layer_config, aux_hidden_state_layer_ids = target
  layer id + 1, speculators_config's speculative_tokens, t2d / d2t beside the weights; a fill-in block (no
  sample_from_anchor, as before speculators #760) of gamma + 1 slots, or sample_from_anchor true with gamma slots;
- speculators #753's config-only edit for SGLang: the same, flattened, renamed to Qwen3DSparkModel, with the
  fields copied into dflash_config / dspark_config, the slot convention left unsaid;
- SpecForge's `export --to hf` of a DSpark draft: the DSpark fields nested in dflash_config (projector_type dspark),
  early exports' heads under logit_head.
"""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.models.checkpoint import checkpoint_convention, load_drafter, read_drafter_config
from dspark.models.checkpoint_convert import REWRITES, convert_checkpoint
from dspark.models.checkpoint_conventions import (CONVENTIONS, DEEPSPEC, SGLANG_EAGLE3, SPECFORGE, SPECULATORS,
                                                  SPECULATORS_ANCHOR_FIRST)
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder, tokens_per_round
from dspark.models.errors import CheckpointError

from tests.paths import EMBEDDED, EMBEDDED_TARGET

DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters")
HEAD_FLAGS = ("mask_token_id", "markov_rank", "markov_head_type", "enable_confidence_head",
              "confidence_head_with_markov")
PROMPTS = ("def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        self.")


def ours(directory):
    return json.loads((directory / "config.json").read_text()), load_file(str(directory / "model.safetensors"))


def write(directory, config, tensors):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def as_speculators(source, directory, sample_from_anchor=None):
    """speculators' DSparkSpeculatorConfig export; sample_from_anchor None: an export from before #760."""
    config, tensors = ours(source)
    anchor_first = config["sample_from_anchor"]
    assert anchor_first == bool(sample_from_anchor), "a layout states what the weights were trained for"
    gamma = config["block_size"]
    vocab = config["vocab_size"]
    out = {"architectures": ["DSparkDraftModel"], "speculators_model_type": "dspark", "speculators_version": "0.5.0",
           "transformer_layer_config": {"model_type": "qwen3", **{k: config[k] for k in DIMS}},
           "draft_vocab_size": vocab, "block_size": gamma if anchor_first else gamma + 1,
           "aux_hidden_state_layer_ids": [i + 1 for i in config["target_layer_ids"]],
           **{k: config[k] for k in HEAD_FLAGS},
           "speculators_config": {"algorithm": "dspark", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": gamma}],
                                  "verifier": {"name_or_path": "embedded/target", "architectures": ["Qwen3ForCausalLM"]}}}
    if sample_from_anchor is not None:
        out["sample_from_anchor"] = sample_from_anchor
    vocab_maps = {"t2d": torch.ones(vocab, dtype=torch.bool), "d2t": torch.zeros(vocab, dtype=torch.int64)}
    return write(directory, out, {**tensors, **vocab_maps})


def as_speculators_753(source, directory):
    """speculators #753: a fill-in export edited for SGLang by config only, the slot convention left unsaid."""
    config, tensors = ours(source)
    exported = json.loads((as_speculators(source, directory / "export") / "config.json").read_text())
    nested = {k: exported[k] for k in ("block_size", *HEAD_FLAGS)}
    out = {**{k: v for k, v in exported.items() if k not in ("transformer_layer_config", "aux_hidden_state_layer_ids")},
           **exported["transformer_layer_config"], "architectures": ["Qwen3DSparkModel"],
           "target_layer_ids": config["target_layer_ids"], "dflash_config": nested, "dspark_config": nested}
    return write(directory, out, tensors)


def as_specforge(source, directory, early_head_names=False):
    """SpecForge's `specforge export --to hf` of a DSpark draft, before normalize_dflash_export.py."""
    config, tensors = ours(source)
    nested = {"projector_type": "dspark", "target_layer_ids": config["target_layer_ids"],
              **{k: config[k] for k in HEAD_FLAGS}}
    out = {"architectures": ["DSparkDraftModel"], "model_type": "qwen3", **{k: config[k] for k in DIMS},
           "block_size": config["block_size"], "num_target_layers": config["num_target_layers"],
           "dflash_config": nested, "auto_map": {"AutoModel": "modeling_dspark.DSparkDraftModel"}}
    if early_head_names:
        tensors = {("logit_head." + n if n.split(".")[0] in ("markov_head", "confidence_head") else n): t
                   for n, t in tensors.items()}
    return write(directory, out, tensors)


def fill_in(source, directory):
    """The committed DSpark drafter's weights as a fill-in drafter in our own layout (gamma + 1 slots, slot j
    predicting anchor + j): what a fill-in trained drafter's checkpoint looks like here."""
    config, tensors = ours(source)
    return write(directory, {**config, "sample_from_anchor": False}, tensors)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    filled = fill_in(EMBEDDED / "dspark", root / "fill-in")
    return {
        "deepspec": (EMBEDDED / "dspark", EMBEDDED / "dspark"),
        "deepspec-dflash": (EMBEDDED / "dflash", EMBEDDED / "dflash"),
        "sglang-eagle3": (EMBEDDED / "eagle3", EMBEDDED / "eagle3"),
        "speculators": (filled, as_speculators(filled, root / "speculators")),
        "speculators-anchor-first": (EMBEDDED / "dspark", as_speculators(EMBEDDED / "dspark", root / "spec-af", True)),
        "speculators-753": (filled, as_speculators_753(filled, root / "speculators-753")),
        "specforge": (EMBEDDED / "dspark", as_specforge(EMBEDDED / "dspark", root / "specforge")),
        "specforge-early": (EMBEDDED / "dspark", as_specforge(EMBEDDED / "dspark", root / "specforge-early", True)),
    }


EXPECTED = {"deepspec": DEEPSPEC, "deepspec-dflash": DEEPSPEC, "sglang-eagle3": SGLANG_EAGLE3,
            "speculators": SPECULATORS, "speculators-anchor-first": SPECULATORS_ANCHOR_FIRST,
            "speculators-753": SPECULATORS, "specforge": SPECFORGE, "specforge-early": SPECFORGE}


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET, dtype=torch.float32).eval()


@pytest.mark.parametrize("name", EXPECTED)
def test_each_trainers_layout_is_named(layouts, name):
    assert checkpoint_convention(layouts[name][1]) == EXPECTED[name]


def test_every_convention_sglang_misreads_has_a_rewrite():
    assert {c for c in CONVENTIONS if not c.served} == set(REWRITES)


@pytest.mark.parametrize("name", [n for n, c in EXPECTED.items() if not c.served])
def test_serve_check_refuses_what_sglang_would_serve_wrong_and_names_the_convert_command(layouts, target, name):
    directory = layouts[name][1]
    with pytest.raises(CheckpointError) as refused:
        read_drafter_config(directory, target.config)  # the fit check `dspark serve` and SGLang's launcher run
    message = str(refused.value)
    assert f"is a {EXPECTED[name].name} checkpoint" in message
    assert f"dspark convert --in {directory} --out NEW_DIR" in message
    if EXPECTED[name] is SPECULATORS:
        assert "shifted slots" in message and "slot j predicts anchor + j" in message


@pytest.mark.parametrize("name", EXPECTED)
def test_convert_writes_the_original_drafter(layouts, target, tmp_path, name):
    original, foreign = layouts[name]
    assert convert_checkpoint(foreign, tmp_path / "out") == EXPECTED[name]
    assert checkpoint_convention(tmp_path / "out") in (DEEPSPEC, SGLANG_EAGLE3)
    assert read_drafter_config(tmp_path / "out", target.config) == read_drafter_config(original, target.config)
    converted, before = load_file(str(tmp_path / "out" / "model.safetensors")), ours(original)[1]
    assert converted.keys() == before.keys() and all(torch.equal(converted[k], before[k]) for k in before)
    if EXPECTED[name].served:  # round trip: already served as trained, so byte for byte the same files
        for file in ("config.json", "model.safetensors"):
            assert (tmp_path / "out" / file).read_bytes() == (original / file).read_bytes()


@pytest.fixture(scope="module")
def decode(target):
    """directory -> (tau, drafts accepted in each round of each prompt), greedy on the embedded target; each
    directory decoded once per module (the original fill-in drafter serves two tests)."""
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    done = {}

    def decoded(directory) -> tuple:
        if directory not in done:
            drafter = load_drafter(directory, target_model=target, dtype=torch.float32)
            generations = SpeculativeDecoder(target, drafter).generate(prompts, GenerationConfig(max_new_tokens=32))
            done[directory] = tokens_per_round(generations), [[r.accepted for r in g.rounds] for g in generations]
        return done[directory]
    return decoded


@pytest.mark.parametrize("name", ["speculators", "speculators-anchor-first"])
def test_a_speculators_drafter_converted_decodes_at_its_original_tau(layouts, decode, tmp_path, name):
    original, foreign = layouts[name]
    convert_checkpoint(foreign, tmp_path / "converted")
    assert decode(tmp_path / "converted") == decode(original)


def test_sglangs_reading_of_the_unconverted_fill_in_drafter_drafts_otherwise(layouts, decode, tmp_path):
    """What SGLang 0.5.23 makes of an unconverted fill-in drafter (block_size taken as gamma, anchor first): other
    drafts, so the refusal above guards something real."""
    original, foreign = layouts["speculators"]
    config, tensors = ours(original)
    block_size = json.loads((foreign / "config.json").read_text())["block_size"]
    shifted = write(tmp_path / "shifted", {**config, "block_size": block_size, "sample_from_anchor": True}, tensors)
    assert decode(shifted)[1] != decode(original)[1]


@pytest.mark.parametrize("change, problem", [
    (lambda c: c.update(aux_hidden_state_layer_ids=[0, 1, 2]), "taps the embedding output"),
    (lambda c: c.update(target_layer_ids=[0, 1, 3]), "is not aux_hidden_state_layer_ids"),
    (lambda c: c.update(draft_vocab_size=1024), "reduced draft vocabulary"),
    (lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=7),
     "proposes [7] speculative tokens, but its block gives 5 drafts"),
    (lambda c: c.update(speculators_model_type="eagle3"), "a speculators 'eagle3' checkpoint"),
    (lambda c: c.update(block_size=1), "leaves no draft slot"),
])
def test_convert_refuses_a_speculators_checkpoint_it_cannot_read_faithfully(layouts, tmp_path, change, problem):
    source = shutil.copytree(layouts["speculators"][1], tmp_path / "in")
    config = json.loads((source / "config.json").read_text())
    change(config)
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        convert_checkpoint(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_convert_refuses_what_it_cannot_identify_and_a_contradiction(layouts, tmp_path):
    with pytest.raises(CheckpointError, match=r"not a dspark drafter checkpoint of any trainer known here: "
                                              r"architectures \['Qwen3ForCausalLM'\]"):
        convert_checkpoint(EMBEDDED_TARGET, tmp_path / "out")
    source = shutil.copytree(layouts["specforge"][1], tmp_path / "in")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "markov_head_type": "gated"}))
    with pytest.raises(CheckpointError, match="markov_head_type is 'gated' at the top level but 'vanilla' nested"):
        convert_checkpoint(source, tmp_path / "out")


def test_sglangs_own_parser_misreads_the_unconverted_fill_in_block_and_reads_the_converted_one(layouts, tmp_path):
    # imported here: SGLang's import takes seconds the other tests of this module do not need
    from sglang.srt.speculative.dspark_components.dspark_config import (get_dspark_sample_from_anchor,
                                                                        resolve_runtime_config)

    def sglang_reads(directory) -> tuple:
        config = json.loads((directory / "config.json").read_text())
        runtime = resolve_runtime_config(draft_hf_config=config, speculative_num_draft_tokens=None,
                                         target_vocab_size=config["vocab_size"])
        return runtime.gamma, get_dspark_sample_from_anchor(config)

    unconverted = layouts["speculators-753"][1]
    assert sglang_reads(unconverted) == (6, True)  # 6 slots read as anchor + k + 1: every slot one position early
    convert_checkpoint(unconverted, tmp_path / "out")
    assert sglang_reads(tmp_path / "out") == (5, False)  # 6 slots fed, drafts read from slots 1..5 as anchor + j
