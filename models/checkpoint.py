"""Drafter checkpoints in the HF layout SGLang 0.5.23 serves and DeepSpec's released drafters use.

A checkpoint is a directory with `config.json` and `model.safetensors`:
- DSpark -> architectures ["Qwen3DSparkModel"] (SGLang `--speculative-algorithm DSPARK`, class
  srt/models/dspark.py::Qwen3DSparkModel). model_type "qwen3" with the draft's dims, plus block_size (= gamma),
  target_layer_ids, mask_token_id, markov_rank, markov_head_type, enable_confidence_head,
  confidence_head_with_markov, sample_from_anchor, num_target_layers. Weights: fc, hidden_norm, norm,
  layers.N.{input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
  mlp.{gate,up,down}_proj}, markov_head.markov_w1/markov_w2 (+ gate_proj or joint_proj), confidence_head.proj,
  and the frozen embed_tokens/lm_head copies (SGLang skips those and shares the target's).
- DFlash with sample_from_anchor=False (the original DFlash layout) -> ["DFlashDraftModel"] (SGLang
  `--speculative-algorithm DFLASH`, srt/models/dflash.py::DFlashDraftModel); there block_size counts the
  anchor slot, so it is gamma + 1. Same weights without the heads.
  DFlash with sample_from_anchor=True (DeepSpec's layout) -> ["Qwen3DSparkModel"] with markov_rank 0, as DeepSpec
  saves it; SGLang 0.5.23 cannot serve that one (DSPARK needs a Markov head, DFLASH reads other slots).
- Eagle3 -> ["LlamaForCausalLMEagle3"] (SGLang `--speculative-algorithm EAGLE3`, srt/models/llama_eagle3.py):
  model_type "llama", eagle_config.eagle_aux_hidden_state_layer_ids = target_layer_ids (SGLang adds the +1
  itself), draft_vocab_size = vocab_size (full vocab, own lm_head), block_size (= gamma, ours). Weights: fc,
  midlayer.* (SGLang maps it to layers.0), norm, lm_head, embed_tokens.

Slim checkpoints (`save_drafter(..., frozen=False)`) leave out the frozen embed_tokens / lm_head copies, which
for a real target dwarf the drafter (SmolLM2: 49152 x 576 each). SGLang shares the target's modules anyway: the
DSPARK / DFLASH draft classes skip `lm_head.` and `embed_tokens.` when loading and attach the target's; Eagle3
always takes the target's embedding (`set_embed`) and takes its lm_head too when config.json's draft_vocab_size
is null (`load_lm_head_from_target`), so a slim Eagle3 config.json sets it to null.

Compact checkpoints (`save_drafter(..., draft_vocab=token_ids)`) are for a drafter trained over its draft vocabulary
(`draft_vocab.json` beside the weights, models/drafters/draft_vocab.py): its Markov tables markov_w1 / markov_w2 keep
only the rows of those tokens (SmolLM2: 8,192 of 49,152 rows, 10 of the drafter's 29 MB). It never drafts the other
tokens, so their W2 rows are never read or trained; their W1 rows are read only for the first draft after an anchor
outside the vocabulary, which then gets no Markov bias (`load_drafter` scatters the rows back with zeros elsewhere).
On the demo's answers that left acceptance unchanged at every position
(bench/results/retired-drafters/smollm2-dspark-chat-vocab/README.md). SGLang reads weights by shape, so
`sglang_checkpoint` writes the full-row copy it serves. A compact Eagle3 is SGLang's own draft-vocabulary layout
instead, served as it is: config.json's draft_vocab_size = V', lm_head.weight holds the V' rows of the target's
head it drafts with, and `d2t` [V'] maps draft index i to token i + d2t[i] (SGLang's hot_token_id). Loading takes
the rest of the head from the target and checks d2t against draft_vocab.json.

`load_drafter(path, target_config, target_model=None)` refuses, with a CheckpointError naming each mismatch, a
checkpoint that is malformed or does not fit the target: hidden size, vocab size, target layer count and ids (out
of range or the final layer), mask token outside the vocab, and missing / unexpected / wrong-shape weights. The
frozen tensors a slim checkpoint lacks are copied from `target_model` (its input and output embeddings); without
a target model that is a CheckpointError.

Checkpoints other trainers write (SpecForge's export, vllm-project/speculators' fill-in or anchor-first blocks) are
told apart in checkpoint_conventions.py; `read_drafter_config` refuses those SGLang would serve wrong, and
checkpoint_convert.py rewrites them into this layout (`dspark convert`).
"""
import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from dspark.models.checkpoint_conventions import (ARCH_DFLASH, ARCH_DSPARK, ARCH_EAGLE3, CONFIG_FILE, WEIGHTS_FILE,
                                                  Convention, identify, require_served, weight_names)
from dspark.models.drafters import DRAFTER_CLASSES, Drafter, DrafterConfig
from dspark.models.drafters.config import target_dimensions, target_field_reader
from dspark.models.drafters.draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab
from dspark.models.errors import CheckpointError, ConfigError
from dspark.models.jsonl import read_json_file

MAX_CONFIG_BYTES = 1 << 20  # a drafter's config.json is about 2 KB
DEFAULT_EAGLE3_GAMMA = 7  # the reference's TTT horizon, for Eagle3 checkpoints that do not record block_size
FROZEN_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")  # copies of the target's, optional in a checkpoint
DRAFT_VOCAB_ROWS = ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight")  # [vocab, rank]; compact: [V', rank]
D2T = "d2t"  # a compact Eagle3's [V'] offsets: draft index i is token i + d2t[i] (SGLang's name)


def architecture(config: DrafterConfig) -> str:
    if config.kind == "eagle3":
        return ARCH_EAGLE3
    if config.kind == "dflash" and not config.sample_from_anchor:
        return ARCH_DFLASH
    return ARCH_DSPARK


def config_to_json(config: DrafterConfig, dtype: torch.dtype, frozen: bool = True,
                   draft_vocab_size: Optional[int] = None) -> dict:
    """The config.json of a drafter (see module docstring); frozen=False: for a slim checkpoint; draft_vocab_size:
    for a compact Eagle3's."""
    arch = architecture(config)
    out = {
        "architectures": [arch],
        "model_type": "llama" if arch == ARCH_EAGLE3 else "qwen3",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "dtype": str(dtype).removeprefix("torch."),
        "num_target_layers": config.num_target_layers,
    }
    if arch == ARCH_EAGLE3:
        out.update(mlp_bias=False, target_hidden_size=config.hidden_size, block_size=config.block_size,
                   eagle_config={"eagle_aux_hidden_state_layer_ids": list(config.target_layer_ids),
                                 "use_aux_hidden_state": True})
        # Own full-vocab head in the file; null makes SGLang take the target's lm_head; V': the compact rows.
        out["draft_vocab_size"] = draft_vocab_size or (config.vocab_size if frozen else None)
        return out
    out.update(
        layer_types=["full_attention"] * config.num_hidden_layers,
        block_size=config.block_slots if arch == ARCH_DFLASH else config.block_size,
        target_layer_ids=list(config.target_layer_ids),
        mask_token_id=config.mask_token_id,
        markov_rank=config.markov_rank,
        markov_head_type=config.markov_head_type,
        enable_confidence_head=config.enable_confidence_head,
        confidence_head_with_markov=config.confidence_head_with_markov,
        sample_from_anchor=config.sample_from_anchor,
    )
    return out


def config_from_json(raw: Any, *, source: str = CONFIG_FILE, target_num_layers: Optional[int] = None) -> DrafterConfig:
    """Parse a drafter config.json; malformed or invalid content raises CheckpointError naming the field.

    target_num_layers fills num_target_layers when the file does not record it (DeepSpec's checkpoints);
    without either, the smallest target the layer ids allow is assumed.
    """
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    # Published drafts may nest their draft keys, as SGLang's parsers accept.
    fields = {**raw, **_nested(raw, "dflash_config", source), **_nested(raw, "dspark_config", source)}
    archs = fields.get("architectures")
    if not isinstance(archs, list) or not archs or archs[0] not in (ARCH_DSPARK, ARCH_DFLASH, ARCH_EAGLE3):
        raise CheckpointError(f"{source}: architectures must be [{ARCH_DSPARK!r}], [{ARCH_DFLASH!r}] or "
                              f"[{ARCH_EAGLE3!r}], got {archs!r}; this is not a dspark drafter checkpoint")
    for name in ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size"):
        _require(fields, name, int, source)
    try:
        dims = target_dimensions(fields)
    except ConfigError as err:
        raise CheckpointError(f"{source}: {err}") from err
    if archs[0] == ARCH_EAGLE3:
        eagle = _nested(raw, "eagle_config", source)
        settings = dict(kind="eagle3", block_size=fields.get("block_size", DEFAULT_EAGLE3_GAMMA),
                        target_layer_ids=_require(eagle, "eagle_aux_hidden_state_layer_ids", list, source))
    else:
        settings = _block_settings(fields, archs[0], source)
    ids = settings["target_layer_ids"]
    recorded = fields.get("num_target_layers")
    fallback = target_num_layers or (max(ids) + 2 if ids and all(isinstance(i, int) for i in ids) else 2)
    dims["num_target_layers"] = recorded if recorded is not None else fallback
    try:
        return DrafterConfig(**dims, num_hidden_layers=_require(fields, "num_hidden_layers", int, source),
                             initializer_range=fields.get("initializer_range", 0.02), **settings)
    except ConfigError as err:
        raise CheckpointError(f"{source}: {err}") from err


def _block_settings(fields: dict, arch: str, source: str) -> dict:
    block_size = _require(fields, "block_size", int, source)
    markov_rank = fields.get("markov_rank", 0)
    if arch == ARCH_DFLASH:  # SGLang's DFLASH block counts the anchor slot and reads drafts from slots 1..
        if fields.get("sample_from_anchor") is True:
            raise CheckpointError(f"{source}: {ARCH_DFLASH} drafts from the slots after the anchor, but the file "
                                  f"sets sample_from_anchor=true; save it as {ARCH_DSPARK} with markov_rank 0")
        gamma, sample_from_anchor, kind = block_size - 1, False, "dflash"
    else:
        gamma, sample_from_anchor = block_size, fields.get("sample_from_anchor", True)
        kind = "dspark" if markov_rank else "dflash"
    return dict(kind=kind, block_size=gamma, sample_from_anchor=sample_from_anchor,
                target_layer_ids=_require(fields, "target_layer_ids", list, source),
                mask_token_id=_require(fields, "mask_token_id", int, source), markov_rank=markov_rank,
                markov_head_type=fields.get("markov_head_type", "vanilla"),
                enable_confidence_head=fields.get("enable_confidence_head", False),
                confidence_head_with_markov=fields.get("confidence_head_with_markov", False))


def check_fits_target(config: DrafterConfig, target_config: Any, *, source: str = "checkpoint") -> None:
    """Raise one CheckpointError listing every way the drafter does not fit the target's HF config."""
    get = target_field_reader(target_config)
    hidden, vocab, layers = get("hidden_size"), get("vocab_size"), get("num_hidden_layers")
    problems = []
    if config.hidden_size != hidden:
        problems.append(f"hidden_size is {config.hidden_size}, the target's is {hidden}")
    if config.vocab_size != vocab:
        problems.append(f"vocab_size is {config.vocab_size}, the target's is {vocab}")
    if config.num_target_layers != layers:
        problems.append(f"num_target_layers is {config.num_target_layers}, the target has {layers} layers")
    for layer_id in config.target_layer_ids:
        if layer_id >= layers:
            problems.append(f"target_layer_ids contains {layer_id}, outside the target's layers 0..{layers - 1}")
        elif layer_id == layers - 1:
            problems.append(f"target_layer_ids contains {layer_id}, the target's final layer (SGLang captures before "
                            f"layer l + 1, which does not exist)")
    if config.mask_token_id is not None and config.mask_token_id >= vocab:
        problems.append(f"mask_token_id {config.mask_token_id} is outside the target's vocab (size {vocab})")
    if problems:
        raise CheckpointError(f"{source} does not fit the target: " + "; ".join(problems)
                              + ". Use a drafter trained for this target.")


def save_drafter(drafter: Drafter, directory, *, frozen: bool = True,
                 draft_vocab: Optional[torch.Tensor] = None) -> Path:
    """Write config.json and model.safetensors into directory (created if missing); returns it.

    frozen=False writes a slim checkpoint without the frozen embedding / lm_head copies; draft_vocab (the sorted
    token ids of the draft_vocab.json that goes beside it) a compact one (module docstring).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    eagle3_compact = draft_vocab is not None and drafter.config.kind == "eagle3"
    config = config_to_json(drafter.config, drafter.dtype, frozen=frozen,
                            draft_vocab_size=len(draft_vocab) if eagle3_compact else None)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    tensors = {name: t.detach().cpu() for name, t in drafter.state_dict().items()
               if frozen or name not in FROZEN_WEIGHTS}
    if eagle3_compact:
        token_ids = draft_vocab.cpu()
        tensors.update({"lm_head.weight": drafter.lm_head.weight.detach().cpu()[token_ids],
                        D2T: token_ids - torch.arange(len(token_ids))})
    elif draft_vocab is not None:
        tensors.update({name: tensors[name][draft_vocab.cpu()] for name in DRAFT_VOCAB_ROWS if name in tensors})
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(directory / WEIGHTS_FILE),
              metadata={"format": "pt"})
    return directory


def read_drafter_config(directory, target_config: Any = None) -> DrafterConfig:
    """The drafter config of the checkpoint in `directory`; given the target's HF config, checked to fit it.

    Cheap (no tensor is read, only the weights file's header): SGLang's plugin runs it in the launcher, before any
    traffic. A checkpoint in another trainer's layout that SGLang would serve wrong (checkpoint_conventions.py) is
    refused, naming its convention and `dspark convert`.
    """
    directory = Path(directory)
    raw, convention = _read_identified(directory)
    # A trainer's layout SGLang would misread (shifted slots, nested heads) is refused before anything else
    require_served(convention, str(directory))
    config_path = directory / CONFIG_FILE
    target_layers = None if target_config is None else target_field_reader(target_config)("num_hidden_layers")
    config = config_from_json(raw, source=str(config_path), target_num_layers=target_layers)
    if target_config is not None:
        check_fits_target(config, target_config, source=str(directory))
    return config


def checkpoint_convention(directory) -> Convention:
    """Which trainer's layout the checkpoint in `directory` is in, from its config.json and weight names
    (checkpoint_conventions.py); a CheckpointError when it is none known."""
    return _read_identified(Path(directory))[1]


def read_raw_config(directory) -> Any:
    """The parsed config.json of the checkpoint in `directory`, read bounded (MAX_CONFIG_BYTES), unchecked."""
    path = Path(directory) / CONFIG_FILE
    return read_json_file(path, str(path), "a drafter config JSON", MAX_CONFIG_BYTES, error=CheckpointError)


def _read_identified(directory: Path) -> tuple:
    """(the raw config.json, its Convention) of a checkpoint directory holding both files."""
    for path in (directory / CONFIG_FILE, directory / WEIGHTS_FILE):
        if not path.is_file():
            raise CheckpointError(f"{path} is missing; a drafter checkpoint holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = read_raw_config(directory)
    return raw, identify(raw, weight_names(directory), source=str(directory / CONFIG_FILE))


def load_drafter(directory, target_config: Any = None, *, target_model: Optional[torch.nn.Module] = None,
                 dtype: Optional[torch.dtype] = None, device="cpu") -> Drafter:
    """Load a drafter; given the target's HF config (or model), first check that it fits (module docstring).

    target_model supplies the frozen embedding / lm_head a slim checkpoint does not store (its config is used
    when target_config is None). dtype defaults to the stored weights' dtype. The embedding and lm_head come
    back frozen.
    """
    if target_config is None and target_model is not None:
        target_config = target_model.config
    config = read_drafter_config(directory, target_config)
    weights_path = Path(directory) / WEIGHTS_FILE
    try:
        tensors = load_file(str(weights_path), device=str(device))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights_path} cannot be read as safetensors: {err}") from err
    stored = next((t.dtype for t in tensors.values() if t.is_floating_point()), None)
    if stored is None:
        raise CheckpointError(f"{weights_path} holds no floating-point tensor: not a drafter's weights")
    draft_head = _eagle3_draft_head(tensors, Path(directory), config.vocab_size, config.hidden_size)
    tensors = _with_frozen_weights(tensors, target_model, str(weights_path))
    if draft_head is not None:  # a compact Eagle3: its own rows over the target's head
        token_ids, rows = draft_head
        head = tensors["lm_head.weight"]
        tensors["lm_head.weight"] = head.clone().index_copy_(0, token_ids.to(head.device), rows.to(head))
    tensors = _with_all_vocab_rows(tensors, Path(directory), config.vocab_size)
    check_weights_match(config, tensors, str(weights_path))
    drafter = DRAFTER_CLASSES[config.kind](config)  # now the size of the weights file
    drafter.load_state_dict(tensors)
    return drafter.to(device=device, dtype=dtype or stored)


def taken_from_target(directory) -> list:
    """What loading the checkpoint takes from the target model: each frozen copy it does not store (FROZEN_WEIGHTS
    names), and for a compact Eagle3, which stores its draft vocabulary's lm_head rows, the rows outside it."""
    stored = weight_names(directory)
    taken = [name for name in FROZEN_WEIGHTS if name not in stored]
    return (taken + ["lm_head.weight rows outside the draft vocabulary"]) if D2T in stored else taken


def stores_frozen_weights(directory) -> bool:
    """Whether the checkpoint holds its own embedding / lm_head copies (False: slim, load with target_model)."""
    return not taken_from_target(directory)


def _with_frozen_weights(tensors: dict, target_model: Optional[torch.nn.Module], source: str) -> dict:
    """The tensors plus the frozen copies a slim checkpoint left out, taken from the target model."""
    missing = [name for name in FROZEN_WEIGHTS if name not in tensors]
    if not missing:
        return tensors
    if target_model is None:
        raise CheckpointError(f"{source} stores no {' / '.join(missing)} (a slim checkpoint shares the target's): "
                              "pass target_model=<the target model> to load_drafter")
    shared = {"embed_tokens.weight": target_model.get_input_embeddings().weight,
              "lm_head.weight": target_model.get_output_embeddings().weight}
    return {**tensors, **{name: shared[name].detach() for name in missing}}


def _eagle3_draft_head(tensors: dict, directory: Path, vocab_size: int, hidden_size: int) -> Optional[tuple]:
    """A compact Eagle3's (token ids [V'], lm_head rows [V', d]), both taken out of `tensors` (module docstring);
    None for any other checkpoint. d2t must name the tokens of draft_vocab.json, which dspark's engine drafts
    among, so that it drafts exactly what SGLang does."""
    if D2T not in tensors:
        return None
    source = directory / WEIGHTS_FILE
    offsets, rows = tensors.pop(D2T), tensors.pop("lm_head.weight", None)
    listed = load_draft_vocab(directory, vocab_size)
    if offsets.dim() != 1:
        raise CheckpointError(f"{source}: {D2T} must be one offset a draft token, got shape {tuple(offsets.shape)}")
    token_ids = offsets.long() + torch.arange(len(offsets), device=offsets.device)
    if rows is None or tuple(rows.shape) != (len(token_ids), hidden_size):
        found = "none" if rows is None else f"shape {tuple(rows.shape)}"
        raise CheckpointError(f"{source}: {D2T} names {len(token_ids)} draft tokens, so lm_head.weight must be "
                              f"[{len(token_ids)}, {hidden_size}]; it has {found}")
    if listed is None or not torch.equal(listed.to(token_ids.device), token_ids):
        raise CheckpointError(f"{source}: {D2T} names {len(token_ids)} draft tokens, and {DRAFT_VOCAB_FILE} beside it "
                              f"{'is missing' if listed is None else 'lists others'}; re-save the drafter")
    return token_ids, rows


def _with_all_vocab_rows(tensors: dict, directory: Path, vocab_size: int) -> dict:
    """A compact checkpoint's Markov tables scattered back to vocab_size rows, zeros outside its draft vocabulary."""
    scalars = [name for name in DRAFT_VOCAB_ROWS if name in tensors and tensors[name].dim() == 0]
    if scalars:
        raise CheckpointError(f"{directory / WEIGHTS_FILE}: {' / '.join(scalars)} must be a table of rows, got a "
                              "scalar")
    compact = [name for name in DRAFT_VOCAB_ROWS if name in tensors and tensors[name].shape[0] != vocab_size]
    if not compact:
        return tensors
    token_ids = load_draft_vocab(directory, vocab_size)
    rows = {tensors[name].shape[0] for name in compact}
    if token_ids is None or rows != {len(token_ids)}:
        found = "none" if token_ids is None else f"{len(token_ids)} tokens"
        raise CheckpointError(f"{directory / WEIGHTS_FILE}: {' / '.join(compact)} hold {sorted(rows)} rows, neither "
                              f"the vocab_size {vocab_size} nor the draft vocabulary's size ({DRAFT_VOCAB_FILE}: "
                              f"{found}); re-save the drafter")
    full = {}
    for name in compact:
        table = tensors[name]
        full[name] = table.new_zeros(vocab_size, *table.shape[1:]).index_copy_(0, token_ids.to(table.device), table)
    return {**tensors, **full}


def is_compact(directory) -> bool:
    """Whether the checkpoint stores its Markov tables over its draft vocabulary only (module docstring)."""
    path = Path(directory) / WEIGHTS_FILE
    config = read_drafter_config(directory)
    try:
        with safe_open(str(path), framework="pt") as handle:
            return any(handle.get_slice(name).get_shape()[:1] != [config.vocab_size]
                       for name in DRAFT_VOCAB_ROWS if name in handle.keys())
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} cannot be read as safetensors: {err}") from err


def sglang_checkpoint(directory, cache: Path) -> Path:
    """The checkpoint SGLang can load: `directory` itself, or for a compact one a full-row copy under
    cache/sglang-drafters/<digest of its weights> (written once; SGLang shares the target's frozen weights
    anyway, so the copy stays slim)."""
    directory = Path(directory)
    if not is_compact(directory):
        return directory
    digest = hashlib.sha256((directory / WEIGHTS_FILE).read_bytes()).hexdigest()[:16]
    out = cache / "sglang-drafters" / digest
    if (out / WEIGHTS_FILE).is_file():
        return out
    config = read_drafter_config(directory)
    tensors = _with_all_vocab_rows(load_file(str(directory / WEIGHTS_FILE)), directory, config.vocab_size)
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, DRAFT_VOCAB_FILE):
        shutil.copyfile(directory / name, staging / name)
    save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
    staging.replace(out)  # a complete copy or none: a killed write is redone by the next start
    return out


def differing_settings(ours: DrafterConfig, theirs: DrafterConfig, ours_named: str) -> list[str]:
    """Each setting in which drafter config `theirs` differs from `ours`, as "name theirs (ours_named: ours)", for
    a refusal to name; empty when they are the same drafter."""
    mine, other = asdict(ours), asdict(theirs)
    return [f"{key} {other.get(key)!r} ({ours_named}: {mine.get(key)!r})" for key in sorted(mine.keys() | other.keys())
            if mine.get(key) != other.get(key)]


def check_weights_match(config: DrafterConfig, tensors: dict, source: str) -> None:
    """Refuse tensors that are not exactly the weights `config` needs, by name and shape; the frozen copies a slim
    checkpoint leaves out may be missing. Shapes only: a config that asks for terabytes allocates nothing."""
    with torch.device("meta"):
        drafter = DRAFTER_CLASSES[config.kind](config)
        frozen = {name: t for name, t in drafter.state_dict().items() if name in FROZEN_WEIGHTS}
    _check_weights(drafter, {**frozen, **tensors}, source)


def _check_weights(drafter: Drafter, tensors: dict, source: str) -> None:
    expected = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [f"{name} is {tuple(tensors[name].shape)}, expected {expected[name]}"
             for name in sorted(set(expected) & set(tensors)) if tuple(tensors[name].shape) != expected[name]]
    problems = ([f"missing weights {missing}"] if missing else []) + \
               ([f"unexpected weights {unexpected}"] if unexpected else []) + \
               ([f"wrong shapes: {'; '.join(wrong)}"] if wrong else [])
    if problems:
        raise CheckpointError(f"{source} does not match its {CONFIG_FILE} ({drafter.config.kind}): "
                              + "; ".join(problems) + ". Re-save the drafter or fix config.json.")


def _nested(raw: dict, key: str, source: str) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: {key} must be a JSON object, got {value!r}")
    return value


def _require(fields: dict, name: str, kind: type, source: str):
    if name not in fields or fields[name] is None:
        raise CheckpointError(f"{source}: required field {name!r} is missing")
    value = fields[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointError(f"{source}: {name} must be a {kind.__name__}, got {value!r}")
    return value
