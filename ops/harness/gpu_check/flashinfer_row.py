"""FlashInfer's chain sampling, padded to gamma and capped per request (kernels/flashinfer_sampling.py), where
FlashInfer imports.

It does not on a lent GPU machine: that machine takes the working tree only up to 64 MiB with the wheels it
needs, and the tracked files may take 48 of them, which leaves 16 MiB. The FlashInfer that SGLang 0.5.23 pins
is one 62.2 MiB wheel on its own, before its dependencies, and it compiles its kernels on first use with nvcc,
which the machine's image lacks (its prebuilt cubins are further wheels). So the row says why and skips.

Where FlashInfer does import (a machine of your own: GPU_PYTHON=<a python with flashinfer>), the check is one
that FlashInfer's own Philox draws cannot blur: with q = p every draft passes u < p/q, so each request must
accept exactly its l_r drafts, as the reference does (the distribution of the emitted tokens is
tests/kernels/test_flashinfer_sampling.py's job).
"""
from __future__ import annotations

import importlib.util

import torch

from dspark.kernels.verification import verify_sampled_torch
from dspark.ops.harness.gpu_check.table import ERROR, FAILED, PASSED, Row, described, skipped
from dspark.ops.harness.gpu_check.timing import median_ms

CHECK = "flashinfer chain sampling, padded + capped, vs PyTorch reference"
PINNED = "flashinfer-python 0.7.2"  # SGLang 0.5.23's pin
PINNED_WHEEL_BYTES = 65_195_219  # flashinfer_python-0.7.2-py3-none-any.whl, measured 2026-12-05
WHEEL_BUDGET_MIB = 64 - 48  # what a lent machine takes, less the bound on the tracked files


def why_not() -> str:
    return (f"FlashInfer is not installed: the {PINNED} wheel is {PINNED_WHEEL_BYTES / 2**20:.1f} MiB alone, over "
            f"the {WHEEL_BUDGET_MIB} MiB left for wheels, and it JIT-compiles its kernels with nvcc, which the "
            "image lacks")


def flashinfer_row(device: torch.device, bs: int, gamma: int, vocab: int, iters: int) -> Row:
    setup = f"{device}, bs {bs}, gamma {gamma}, vocab {vocab}"
    reasons = [] if device.type == "cuda" else ["no CUDA device"]
    if importlib.util.find_spec("flashinfer") is None:
        reasons.append(why_not())
    if reasons:
        return skipped([CHECK], setup, "; ".join(reasons))[0]
    from dspark.kernels.flashinfer_sampling import verify_sampled_flashinfer

    g = torch.Generator(device).manual_seed(0)
    p = torch.softmax(3 * torch.randn(bs, gamma + 1, vocab, device=device, generator=g), -1)
    q = p[:, :gamma].contiguous()
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(bs, gamma)
    lengths = torch.randint(0, gamma + 1, (bs,), device=device, generator=g)
    chain = dict(target_probs=p, draft_probs=q, draft_tokens=drafts, lengths=lengths)
    uniforms = dict(uniforms=torch.rand(bs, gamma, device=device, generator=g),
                    final_uniforms=torch.rand(bs, device=device, generator=g))
    try:
        verdict = verify_sampled_flashinfer(**chain)
        reference = verify_sampled_torch(**chain, **uniforms)
        differ = int((verdict.accepted != reference.accepted).sum())
        err = float((verdict.accepted - reference.accepted).abs().max())
        reference_ms = median_ms(lambda: verify_sampled_torch(**chain, **uniforms), device, iters)
        flashinfer_ms = median_ms(lambda: verify_sampled_flashinfer(**chain), device, iters)
    except Exception as error:  # reported in the table, like every other check
        return Row(CHECK, setup, ERROR, notes=described(error))
    notes = f"accepted counts on q = p: {differ} of {bs} differ" if differ else "accepted counts on q = p equal"
    return Row(CHECK, setup, FAILED if differ else PASSED, err, f"{reference_ms:.3f} ms", f"{flashinfer_ms:.3f} ms",
               notes)
