"""The target model's I/O, below both decoding and training: its config and tokenizer, its weights as a frozen
float32 model, the fingerprint of its weights, its stop tokens, and whether a device computes bf16 natively.

Decoding (models/decoding/loading.py builds the engine's `Target` on these), training (models/training/run.py)
and the commands that only need the config read the target through this one module.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from dspark.models.errors import CheckpointError

FINGERPRINT_CHUNK_BYTES = 16 << 20


def load_target_config(target_dir: Path):
    """The target's HF config and tokenizer (cheap: lets every setting be checked before weights load)."""
    target_dir = Path(target_dir)
    if not (target_dir / "config.json").is_file():
        raise CheckpointError(f"--target {target_dir} has no config.json: pass a transformers model directory "
                              "(e.g. embedded/target)")
    try:
        return AutoConfig.from_pretrained(str(target_dir)), AutoTokenizer.from_pretrained(str(target_dir))
    except (ValueError, OSError) as err:
        raise CheckpointError(f"--target {target_dir} cannot be read as a transformers model directory: "
                              f"{err}") from err


def load_frozen_target(target_dir: Path, device: torch.device) -> torch.nn.Module:
    """The target in float32, frozen (no gradients): what training reads features and replies from."""
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).to(device).eval()
    return model.requires_grad_(False)


def target_fingerprint(target_dir: Path) -> str:
    """sha256 of the target's weights file(s): part of the data-cache key and the card (of any model folder: the
    capture records the drafter's too)."""
    digest = hashlib.sha256()
    files = sorted(Path(target_dir).glob("*.safetensors")) or sorted(Path(target_dir).glob("*.bin"))
    for path in files:
        with path.open("rb") as handle:  # in chunks: a shard of a large target is gigabytes
            while chunk := handle.read(FINGERPRINT_CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()


def stop_token_ids(model, tokenizer) -> tuple:
    """The model's generation_config eos_token_id (int or list), else the tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))


def computes_bf16_natively(device: torch.device) -> bool:
    """Whether bf16 matmuls on `device` run on bf16 hardware: any GPU; a CPU with avx512_bf16 / AMX. Elsewhere
    the CPU emulates them, far slower than float32 (reply generation on a 2-core AVX2 CPU under --bf16: 248 s a
    batch of 64, against 19 s on a CPU with avx512_bf16)."""
    if torch.device(device).type != "cpu":
        return True
    # (a private torch probe, hence getattr: a torch without it counts as no native bf16, never an error)
    return getattr(torch.cpu, "_is_avx512_bf16_supported", bool)()
