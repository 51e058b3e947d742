"""Which trainer wrote a drafter checkpoint, and whether SGLang 0.5.23 serves it as it was trained.

Block drafters differ between trainers less in their weights (the names match SGLang's: fc, hidden_norm, layers.N.*,
norm, markov_head.*, confidence_head.*) than in what their config.json says, and one difference changes what every
slot of the block means (docs/training.md, "Checkpoint conventions"):
- DEEPSPEC: the layout this repo writes and DeepSpec's released drafters use (models/checkpoint.py). Every field
  SGLang's draft model reads is at the top level; block_size is gamma; `sample_from_anchor` (default true) says
  slot k predicts anchor + k + 1 in a block of gamma slots, false that the block has gamma + 1 slots and slot j
  predicts anchor + j. DFLASH's `DFlashDraftModel` (block_size counting the anchor slot) belongs here too.
- SGLANG_EAGLE3: SGLang's own Eagle3 layout (`LlamaForCausalLMEagle3`, `eagle_config`), which SpecForge's Eagle3
  export writes too. Served as it is.
- SPECFORGE: SpecForge's `specforge export --to hf` of a DSpark draft before its normalize script ran: the
  DSpark fields nested in `dflash_config` (`projector_type` "dspark") or `dspark_config`, often the architecture
  `DSparkDraftModel`. Its block is anchor-first, block_size = gamma. SGLang 0.5.23's draft model reads
  markov_rank, the confidence-head flags and sample_from_anchor from the top level only (srt/models/dspark.py
  build_markov_head / build_confidence_head, dspark_config.get_dspark_sample_from_anchor): nested, the load fails
  or a confidence head the checkpoint lacks is switched on.
- SPECULATORS / SPECULATORS_ANCHOR_FIRST: vllm-project/speculators' format: `speculators_model_type`, the
  backbone's dims in `transformer_layer_config`, `aux_hidden_state_layer_ids` counted from the embedding output
  (aux id = target layer id + 1), `speculators_config`, `t2d` / `d2t` beside the weights. Before speculators #760
  every export was fill-in: block_size slots of which slot 0 is the anchor, untrained, and slot j predicts
  anchor + j (gamma = block_size - 1); #760 added `sample_from_anchor`, true meaning DeepSpec's anchor-first
  block. A fill-in drafter whose config does not say sample_from_anchor=false (the field absent, as in every
  export before #760 and after speculators #753's config-only edit) is served by SGLang 0.5.23 with shifted slots:
  it defaults to anchor-first, takes block_size as gamma and reads slot k as anchor + k + 1, one position early,
  which drops acceptance to about one token a round with no error anywhere.

Only DEEPSPEC and SGLANG_EAGLE3 are served: `require_served` refuses the others by name and names the command
that converts them (`dspark convert`, models/checkpoint_convert.py). A config that matches none is refused too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from safetensors import SafetensorError, safe_open

from dspark.models.errors import CheckpointError, shown

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCH_DSPARK = "Qwen3DSparkModel"
ARCH_DFLASH = "DFlashDraftModel"
ARCH_EAGLE3 = "LlamaForCausalLMEagle3"
ARCH_SPECFORGE_DSPARK = "DSparkDraftModel"  # SpecForge's class name (also one of SGLang's DSpark entry classes)
SPECULATORS_KEYS = ("speculators_model_type", "speculators_config", "speculators_version",
                    "transformer_layer_config", "aux_hidden_state_layer_ids")
SPECULATORS_ONLY_WEIGHTS = ("t2d",)  # speculators' target-to-draft mask: no block drafter SGLang reads has one
NESTED_BLOCKS = ("dflash_config", "dspark_config")
MARKOV_FIELD = "markov_rank"
CONVERT_COMMAND = "dspark convert --in {source} --out NEW_DIR"


@dataclass(frozen=True)
class Convention:
    name: str
    trainer: str
    slots: str  # what each block slot predicts
    served: bool  # SGLang 0.5.23 serves it as trained
    sglang_reads: str = ""  # for those it does not: what SGLang would do with it


DEEPSPEC = Convention("DeepSpec", "DeepSpec / dspark train", "as recorded by block_size and sample_from_anchor",
                      served=True)
SGLANG_EAGLE3 = Convention("SGLang Eagle3", "SGLang / SpecForge Eagle3", "autoregressive, one token a step",
                           served=True)
SPECFORGE = Convention(
    "SpecForge export", "SpecForge (specforge export --to hf)", "slot k predicts anchor + k + 1 (gamma slots)",
    served=False, sglang_reads="SGLang 0.5.23 reads markov_rank, the confidence-head flags and sample_from_anchor "
                               "from the top level only, so it refuses the nested Markov head or builds a "
                               "confidence head the checkpoint does not have")
SPECULATORS = Convention(
    "speculators", "vllm-project/speculators",
    "slot j predicts anchor + j (block_size slots, slot 0 the untrained anchor, gamma = block_size - 1)",
    served=False, sglang_reads="SGLang 0.5.23 would serve it with shifted slots once its loader can read it (as "
                               "after speculators #753's config-only edit): without sample_from_anchor=false it "
                               "reads slot k as anchor + k + 1, one position early (acceptance falls to about 1)")
SPECULATORS_ANCHOR_FIRST = Convention(
    "speculators (sample_from_anchor)", "vllm-project/speculators", "slot k predicts anchor + k + 1 (gamma slots)",
    served=False, sglang_reads="SGLang 0.5.23 cannot read its nested transformer_layer_config or its "
                               "aux_hidden_state_layer_ids (one more than SGLang's target_layer_ids)")
CONVENTIONS = (DEEPSPEC, SGLANG_EAGLE3, SPECFORGE, SPECULATORS, SPECULATORS_ANCHOR_FIRST)


def identify(raw: Any, weight_names: Iterable[str] = (), *, source: str = CONFIG_FILE) -> Convention:
    """The convention of a checkpoint from its parsed config.json and its weight names; a CheckpointError naming
    what was seen when it matches none."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    markers = [key for key in SPECULATORS_KEYS if key in raw]
    if arch != ARCH_EAGLE3:  # SpecForge's Eagle3 keeps a t2d too, which SGLang skips
        markers += sorted(set(weight_names) & set(SPECULATORS_ONLY_WEIGHTS))
    if markers:
        kind = raw.get("speculators_model_type", "dspark")
        if kind not in ("dspark", "dflash"):
            raise CheckpointError(f"{source}: a speculators {shown(kind)} checkpoint ({', '.join(markers)}); only "
                                  "speculators' dspark and dflash drafters are identified")
        return SPECULATORS_ANCHOR_FIRST if raw.get("sample_from_anchor") is True else SPECULATORS
    if arch == ARCH_EAGLE3:
        return SGLANG_EAGLE3
    nested = {key: raw[key] for key in NESTED_BLOCKS if isinstance(raw.get(key), dict)}
    nested_dspark = any(block.get("projector_type") == "dspark" or MARKOV_FIELD in block for block in nested.values())
    if arch == ARCH_SPECFORGE_DSPARK or (nested_dspark and MARKOV_FIELD not in raw):
        return SPECFORGE
    if arch in (ARCH_DSPARK, ARCH_DFLASH):
        return DEEPSPEC
    raise CheckpointError(
        f"{source}: not a dspark drafter checkpoint of any trainer known here: architectures {shown(archs)}, and "
        f"none of speculators' keys ({', '.join(SPECULATORS_KEYS)}). Known: " + "; ".join(
            f"{c.name} ({c.trainer})" for c in CONVENTIONS))


def require_served(convention: Convention, source: str) -> None:
    """Refuse a checkpoint SGLang 0.5.23 does not serve as trained, naming its convention and the convert command."""
    if not convention.served:
        raise CheckpointError(
            f"{source} is a {convention.name} checkpoint ({convention.trainer}; {convention.slots}): "
            f"{convention.sglang_reads}. Convert it first: {CONVERT_COMMAND.format(source=source)}")


def weight_names(directory) -> set:
    """The tensor names of a checkpoint's weights file (its header only: no tensor is read)."""
    path = Path(directory) / WEIGHTS_FILE
    try:
        with safe_open(str(path), framework="pt") as handle:
            return set(handle.keys())
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} cannot be read as safetensors: {err}") from err


def nested_fields(raw: dict, source: str) -> dict:
    """The DSpark fields a config nests under dflash_config / dspark_config (the latter wins), as SGLang merges them."""
    fields: dict = {}
    for key in NESTED_BLOCKS:
        value = raw.get(key) or {}
        if not isinstance(value, dict):
            raise CheckpointError(f"{source}: {key} must be a JSON object, got {shown(value)}")
        fields.update(value)
    return fields


def field(raw: dict, name: str, source: str, default: Optional[Any] = None) -> Any:
    """A field set at the top level or nested; both set to different values is refused, naming both."""
    nested = nested_fields(raw, source)
    if name in raw and name in nested and raw[name] != nested[name]:
        raise CheckpointError(f"{source}: {name} is {shown(raw[name])} at the top level but {shown(nested[name])} "
                              f"nested; the checkpoint contradicts itself")
    return raw.get(name, nested.get(name, default))
