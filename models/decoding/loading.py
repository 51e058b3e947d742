"""Load a target and a drafter for decoding, with the checks that give bad input a clear error.

The target loads in float32 (CPU matmuls in bf16 are slow without AMX; a GPU run may pass another dtype): its
numbers are the output distribution we promise. The drafter loads through checkpoint.load_drafter, which refuses
one that does not fit the target, on the target's device, in the dtype `drafter_dtype` picks.

On CPU in float32 every linear of both models (the target's and the drafter's) computes the way a load-time probe
measures fastest at the row counts decoding sends (cpu_linears.py): the same products in another rounding order,
for decoding and for the target-alone baseline alike (`--cpu-linears auto`, the default). `--cpu-linears
default` keeps PyTorch's path, and the SGLang plugin profiles SGLang's own model that way.

A drafter with a draft vocabulary (`draft_vocab.json` beside its weights; models/drafters/draft_vocab.py) drafts
only among those tokens (`--draft-vocab auto`, the default; `full` ignores the file): verification stays exact,
and the drafting pass's vocabulary products shrink with it.

The drafter's dtype is free: it only proposes. Greedy verification keeps the target's argmax whatever was
proposed, and sampled verification reads q from the very logits the drafts were drawn from (DraftBlock.probs,
warping.probs casts them to float32 either way), so a bfloat16 drafter beside a float32 target is as lossless as a
float32 one. On a CPU with AMX / avx512_bf16 it is cheaper: its pass is mostly the full-vocabulary lm_head over
gamma positions plus gamma Markov-bias products, both bound by reading weights. SmolLM2-135M's DSpark drafter,
batch 1, two threads: 37-40 ms a pass in float32, 22-24 ms in bfloat16.

    auto      bfloat16 for a float32 target on a CPU that computes bf16 natively (avx512_bf16), else the
              target's dtype
    float32 / bfloat16   as named
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoModelForCausalLM

from dspark.models.checkpoint import load_drafter
from dspark.models.decoding.cpu_linears import with_fastest_linears
from dspark.models.drafters.base import Drafter
from dspark.models.drafters.draft_vocab import load_draft_vocab
from dspark.models.errors import ConfigError
from dspark.models.target_io import computes_bf16_natively, load_target_config, stop_token_ids


@dataclass(frozen=True)
class Target:
    model: torch.nn.Module
    tokenizer: object
    eos_token_ids: tuple
    path: Path


CPU_LINEARS = ("auto", "default")  # auto: probed per shape and row count (cpu_linears.py); default: PyTorch's
DEFAULT_CPU_LINEARS = "auto"


def probed_rows(block: int = 8) -> tuple:
    """The row counts the linears are probed at: every count up to a block (a decode step, a verify round of one
    request, a drafter block or its features). Larger calls keep PyTorch's default: on SmolLM2 (2-core AVX2 EPYC,
    2026-12-03) the strategies a per-shape probe picked at 16-64 rows made whole target forwards of 14-32 rows
    20% slower, while up to 8 rows they made them 8-40% faster."""
    return tuple(range(1, max(block, 8) + 1))


def with_cpu_linears(module: torch.nn.Module, choice: str, row_counts, skip=()) -> torch.nn.Module:
    """`module` with its linears (but those in `skip`) as `choice` picks (module docstring)."""
    if choice not in CPU_LINEARS:
        raise ConfigError(f"cpu_linears must be one of {'|'.join(CPU_LINEARS)}, got {choice!r}")
    return with_fastest_linears(module, row_counts, skip) if choice == "auto" else module


def load_target(directory: Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                cpu_linears: str = DEFAULT_CPU_LINEARS) -> Target:
    directory = Path(directory)
    config, tokenizer = load_target_config(directory)  # CheckpointError when there is no config.json
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).to(device).eval()
    with_cpu_linears(model, cpu_linears, probed_rows())
    return Target(model=model, tokenizer=tokenizer, eos_token_ids=stop_token_ids(model, tokenizer), path=directory)


DRAFTER_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_DRAFTER_DTYPE = "auto"


def drafter_dtype(choice: str, target_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the drafter computes in (module docstring)."""
    if choice not in DRAFTER_DTYPES:
        raise ConfigError(f"drafter dtype must be one of {'|'.join(DRAFTER_DTYPES)}, got {choice!r}")
    if choice != "auto":
        return DRAFTER_DTYPES[choice]
    native_cpu_bf16 = torch.device(device).type == "cpu" and computes_bf16_natively(device)
    return torch.bfloat16 if target_dtype == torch.float32 and native_cpu_bf16 else target_dtype


DRAFT_VOCABS = ("auto", "full")  # auto: the drafter's draft_vocab.json when it has one; full: every token
DEFAULT_DRAFT_VOCAB = "auto"


def load_drafter_for(directory: Optional[Path], target: Target, dtype: str = DEFAULT_DRAFTER_DTYPE,
                     cpu_linears: str = DEFAULT_CPU_LINEARS, draft_vocab: str = DEFAULT_DRAFT_VOCAB
                     ) -> Optional[Drafter]:
    """The drafter at `directory` checked against the target (None: no speculation), in the `dtype` choice,
    drafting over its draft vocabulary as `draft_vocab` picks (module docstring)."""
    if draft_vocab not in DRAFT_VOCABS:
        raise ConfigError(f"draft_vocab must be one of {'|'.join(DRAFT_VOCABS)}, got {draft_vocab!r}")
    if directory is None:
        return None
    parameter = next(target.model.parameters())  # a slim checkpoint copies the target's embedding / lm_head
    drafter = load_drafter(Path(directory), target.model.config, device=parameter.device, target_model=target.model,
                           dtype=drafter_dtype(dtype, parameter.dtype, parameter.device))
    token_ids = load_draft_vocab(Path(directory), drafter.config.vocab_size) if draft_vocab == "auto" else None
    if token_ids is not None:
        drafter.restrict_vocabulary(token_ids)
    # an Eagle3 or Markov step (1 row) up to the features of a fully accepted block (gamma + 1 rows); the
    # full-vocabulary heads a draft vocabulary replaces are not probed (their oneDNN copy alone would be 113 MB)
    return with_cpu_linears(drafter, cpu_linears, probed_rows(drafter.config.gamma + 1),
                            skip=drafter.heads_replaced_by_draft_vocab())
