"""Rewrite a drafter checkpoint from another trainer's layout into the one SGLang 0.5.23 serves as trained.

`convert_checkpoint(source, out)` identifies the source (checkpoint_conventions.py), rewrites its config.json into
the DeepSpec layout this repo writes (checkpoint.config_to_json: every field SGLang reads at the top level,
block_size = gamma, sample_from_anchor saying how the block was trained) and its weight names where they differ,
and checks the result as `dspark serve` will (read_drafter_config, and every weight against the config by name
and shape). The tensors are copied as they are: a slot convention is a statement about what the slots mean, so
the same weights decode the same tokens once the config says it. What changes, by source:
- speculators: the dims come out of transformer_layer_config; target_layer_ids = aux_hidden_state_layer_ids - 1
  (an aux id of 0, the embedding output, has no SGLang equivalent and is refused); a fill-in block of B slots
  becomes block_size B - 1 with sample_from_anchor false (SGLang then feeds B slots and reads slots 1..B - 1),
  an anchor-first one keeps block_size B; speculators_config's speculative_tokens, when present, must agree;
  t2d / d2t are dropped when they map the whole vocabulary (a reduced draft vocabulary is refused by name) and
  the verifier copies (verifier_norm, verifier_lm_head) are dropped.
- SpecForge export: the fields nested in dflash_config / dspark_config move to the top level (a field set both
  ways to different values is refused); early exports' logit_head.markov_head.* / logit_head.confidence_head.*
  lose the logit_head. prefix.
- DeepSpec, SGLang Eagle3: already served as trained; copied unchanged.
Absent confidence-head flags are read off the weights (confidence_head.* present or not), since SGLang would
otherwise enable a head the checkpoint lacks. num_target_layers is written only when the source records it; else
it comes from the target at load time, as for DeepSpec's own drafters.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dspark.models.checkpoint import (CONFIG_FILE, WEIGHTS_FILE, check_weights_match, config_from_json,
                                      config_to_json, read_drafter_config, read_raw_config)
from dspark.models.checkpoint_conventions import (ARCH_DSPARK, NESTED_BLOCKS, SPECFORGE, SPECULATORS,
                                                  SPECULATORS_ANCHOR_FIRST, SPECULATORS_KEYS, Convention, field,
                                                  identify)
from dspark.models.drafters.draft_vocab import DRAFT_VOCAB_FILE
from dspark.models.errors import CheckpointError, shown

BLOCK_FIELDS = ("block_size", "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type",
                "enable_confidence_head", "confidence_head_with_markov", "sample_from_anchor", "num_target_layers")
SPECFORGE_PREFIXES = (("logit_head.markov_head.", "markov_head."), ("logit_head.confidence_head.", "confidence_head."))
VERIFIER_COPIES = ("verifier_norm.weight", "verifier_lm_head.weight")  # speculators' frozen copies, unused by SGLang
VOCAB_MAPS = ("t2d", "d2t")


def convert_checkpoint(source, out) -> Convention:
    """Write `source` into `out` (a new or empty directory) in the layout SGLang serves; returns the source's
    convention. Anything unidentified, inconsistent or not convertible is a CheckpointError naming it."""
    source, out = Path(source), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out} exists and is not an empty directory; convert writes a new checkpoint")
    raw = read_raw_config(source)
    tensors = _load_weights(source)
    convention = identify(raw, tensors, source=str(source / CONFIG_FILE))
    if convention.served:
        read_drafter_config(source)  # served as it is, so it must read as it is: nothing is copied otherwise
        out.mkdir(parents=True, exist_ok=True)
        for name in (CONFIG_FILE, WEIGHTS_FILE, DRAFT_VOCAB_FILE):
            if (source / name).is_file():
                shutil.copyfile(source / name, out / name)
    else:
        fields, tensors = REWRITES[convention](raw, tensors, str(source / CONFIG_FILE))
        config = config_from_json(fields, source=str(source / CONFIG_FILE))  # checked whole before a byte is written
        check_weights_match(config, tensors, str(source / WEIGHTS_FILE))
        written = config_to_json(config, next(t.dtype for t in tensors.values() if t.is_floating_point()))
        if fields.get("num_target_layers") is None:
            del written["num_target_layers"]  # taken from the target at load time, never guessed into the file
        out.mkdir(parents=True, exist_ok=True)
        save_file({name: t.contiguous() for name, t in tensors.items()}, str(out / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        (out / CONFIG_FILE).write_text(json.dumps(written, indent=2) + "\n")
    read_drafter_config(out)  # what serve checks: the result is served as trained
    return convention


def _lifted(raw: dict, source: str) -> dict:
    """The block-drafter fields a config records, at the top level or nested (checkpoint_conventions.field)."""
    values = {name: field(raw, name, source) for name in BLOCK_FIELDS}
    return {name: value for name, value in values.items() if value is not None}


def _from_specforge(raw: dict, tensors: dict, source: str) -> tuple:
    fields = {key: value for key, value in raw.items() if key not in (*NESTED_BLOCKS, "auto_map")}
    fields.update(_lifted(raw, source))
    renamed = {}
    for name, tensor in tensors.items():
        for old, new in SPECFORGE_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old):]
        renamed[name] = tensor
    return _block_fields(fields, renamed), renamed


def _from_speculators(raw: dict, tensors: dict, source: str) -> tuple:
    backbone = raw.get("transformer_layer_config", {})
    if not isinstance(backbone, dict):
        raise CheckpointError(f"{source}: transformer_layer_config must be a JSON object, got {shown(backbone)}")
    fields = {**{key: value for key, value in raw.items() if key not in (*SPECULATORS_KEYS, *NESTED_BLOCKS)},
              **backbone, **_lifted(raw, source)}
    anchor_first = raw.get("sample_from_anchor") is True
    block = fields.get("block_size")
    if isinstance(block, int) and not isinstance(block, bool):
        fields["block_size"] = block if anchor_first else block - 1
        if fields["block_size"] < 1:
            raise CheckpointError(f"{source}: block_size {block} leaves no draft slot after the anchor")
    fields["sample_from_anchor"] = anchor_first
    fields["target_layer_ids"] = _speculators_layer_ids(raw, fields.get("target_layer_ids"), source)
    _check_speculative_tokens(raw, fields.get("block_size"), source)
    return _block_fields(fields, tensors), _without_vocab_maps(fields, tensors, raw, source)


def _block_fields(fields: dict, tensors: dict) -> dict:
    """fields as a DeepSpec block drafter's config: the DSpark architecture, the confidence-head flags the weights
    imply when the source did not record them."""
    has_head = any(name.startswith("confidence_head.") for name in tensors)
    fields.setdefault("enable_confidence_head", has_head)
    fields.setdefault("confidence_head_with_markov", has_head and bool(fields.get("markov_rank")))
    return {**fields, "architectures": [ARCH_DSPARK], "model_type": "qwen3"}


def _speculators_layer_ids(raw: dict, recorded, source: str) -> list:
    """SGLang's target_layer_ids from speculators' aux ids (one more: they count the embedding output as 0)."""
    aux = raw.get("aux_hidden_state_layer_ids")
    if aux is None:
        return recorded
    if not isinstance(aux, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in aux):
        raise CheckpointError(f"{source}: aux_hidden_state_layer_ids must be a list of ints, got {shown(aux)}")
    if any(i < 1 for i in aux):
        raise CheckpointError(f"{source}: aux_hidden_state_layer_ids {shown(aux)} taps the embedding output (id 0), "
                              "which SGLang's DSpark cannot capture")
    ids = [i - 1 for i in aux]
    if recorded is not None and recorded != ids:
        raise CheckpointError(f"{source}: target_layer_ids {shown(recorded)} is not aux_hidden_state_layer_ids "
                              f"{shown(aux)} minus one; the checkpoint contradicts itself")
    return ids


def _check_speculative_tokens(raw: dict, gamma, source: str) -> None:
    """speculators_config's proposal methods, when they say how many tokens they propose, must say gamma."""
    spec = raw.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    methods = methods if isinstance(methods, list) else []
    proposed = [m.get("speculative_tokens") for m in methods if isinstance(m, dict)]
    wrong = [n for n in proposed if n is not None and n != gamma]
    if wrong:
        raise CheckpointError(f"{source}: speculators_config proposes {shown(wrong)} speculative tokens, but its block "
                              f"gives {gamma} drafts; the checkpoint contradicts itself")


def _without_vocab_maps(fields: dict, tensors: dict, raw: dict, source: str) -> dict:
    """tensors less speculators' verifier copies and its vocabulary maps, which must map the whole vocabulary."""
    vocab = fields.get("vocab_size")
    draft_vocab = raw.get("draft_vocab_size", vocab)
    if draft_vocab != vocab or "lm_head.weight" in tensors and (
            not isinstance(vocab, int) or tensors["lm_head.weight"].shape[0] != vocab):
        raise CheckpointError(f"{source}: a reduced draft vocabulary (draft_vocab_size {shown(draft_vocab)} of "
                              f"{shown(vocab)}, with t2d / d2t); convert covers full-vocabulary drafters only")
    whole = {"t2d": lambda t: bool(t.bool().all()), "d2t": lambda t: not bool(t.any())}
    for name in VOCAB_MAPS:
        if name in tensors and not whole[name](tensors[name]):
            raise CheckpointError(f"{source}: {name} maps only part of the vocabulary; convert covers "
                                  "full-vocabulary drafters only")
    return {name: t for name, t in tensors.items() if name not in (*VOCAB_MAPS, *VERIFIER_COPIES)}


def _load_weights(source: Path) -> dict:
    path = source / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; a drafter checkpoint holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} cannot be read as safetensors: {err}") from err
    if not any(t.is_floating_point() for t in tensors.values()):
        raise CheckpointError(f"{path} holds no floating-point tensor: not a drafter's weights")
    return tensors


REWRITES: dict[Convention, Callable[[dict, dict, str], tuple]] = {
    SPECFORGE: _from_specforge, SPECULATORS: _from_speculators, SPECULATORS_ANCHOR_FIRST: _from_speculators}
