"""A copy of a drafter checkpoint with its weights moved a little: another drafter of the same shapes, vocabulary
and settings, whose weights digest (target_fingerprint) differs. Verification is lossless, so its greedy answers
are the original's; its acceptance differs with `scale`."""
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def perturbed_copy(source: Path, destination: Path, scale: float, seed: int = 0) -> Path:
    """Every file of `source` copied to `destination`, each weight w replaced by w + scale * |w|.mean() * N(0, 1)."""
    shutil.copytree(source, destination)
    generator = torch.Generator().manual_seed(seed)
    tensors = load_file(str(source / WEIGHTS))
    moved = {}
    for name, tensor in tensors.items():
        noise = torch.randn(tensor.shape, generator=generator) * scale * tensor.float().abs().mean()
        moved[name] = (tensor.float() + noise).to(tensor.dtype).contiguous()
    save_file(moved, str(destination / WEIGHTS), metadata={"format": "pt"})
    return destination
