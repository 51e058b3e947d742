"""One Markov drafting step for a batch: the bias, the corrected logits and the drawn token.

DSpark drafts a block left to right (models/drafters/markov_head.py): position k's logits are the parallel
backbone's base logits U_k plus a low-rank bias from the token just drawn at position k - 1,

    logits_k = U_k + W2 z_k,   z_k = W1[x_{k-1}] (vanilla; the gated / rnn heads compute z_k from it too),
    x_k      = argmax logits_k                                   (greedy)
             = inverse-CDF sample of warp(logits_k) at uniform u  (sampling: softmax(logits_k / T), then
                                                                   top-k / top-p as kernels/warping.py)

so the bias is a [rank] x [rank, vocab] product per request and the sample needs the whole row: the step is
on the serial path of every draft position. `markov_sample_step_torch` is the reference;
`markov_sample_step_triton` (bodies in kernels/jit/markov.py) fuses the bias into the logits and samples in
one pass per request, for temperature-only sampling (a top-k / top-p warp takes the reference; the triton
function refuses it by name). Both have the same keyword-only signature and return the same tokens on the
same uniforms (tested). `markov_sample_step` draws the uniforms from the caller's generator (one
torch.rand(bs) per step; none when greedy) and picks the kernel by device (kernels/triton_launch.py).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from dspark.kernels import triton_launch, warping
from dspark.kernels.verification import sample_inverse_cdf
from dspark.kernels.warping import SamplingParams

BIAS_BLOCK_V = 128  # vocabulary rows per program of the bias kernel


def markov_sample_step(base_logits: torch.Tensor, code: torch.Tensor, w2: torch.Tensor, sampling: SamplingParams,
                       generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """base_logits [bs, vocab]; code [bs, rank]; w2 [vocab, rank] -> (tokens [bs] long, logits [bs, vocab])."""
    uniforms = None if sampling.greedy else torch.rand(base_logits.shape[0], generator=generator,
                                                       device=base_logits.device)
    fast = triton_launch.use_triton(base_logits) and triton_supports(sampling)
    step = markov_sample_step_triton if fast else markov_sample_step_torch
    return step(base_logits=base_logits, code=code, w2=w2, sampling=sampling, uniforms=uniforms)


def markov_sample_step_torch(*, base_logits: torch.Tensor, code: torch.Tensor, w2: torch.Tensor,
                             sampling: SamplingParams, uniforms: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    logits = base_logits + F.linear(code.to(w2.dtype), w2).to(base_logits.dtype)
    if sampling.greedy:
        return logits.argmax(dim=-1), logits
    return sample_inverse_cdf(warping.probs(logits, sampling), uniforms), logits


def markov_sample_step_triton(*, base_logits: torch.Tensor, code: torch.Tensor, w2: torch.Tensor,
                              sampling: SamplingParams, uniforms: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    bs, vocab = check_step(base_logits, code, w2, sampling, uniforms)
    kernels = triton_launch.load("markov", base_logits)
    base, code, w2 = base_logits.contiguous(), code.contiguous(), w2.contiguous()
    logits = torch.empty_like(base)
    tokens = torch.empty(bs, dtype=torch.long, device=base.device)
    if bs:
        rank = code.shape[1]
        kernels.markov_logits_kernel[(bs, triton_launch.cdiv(vocab, BIAS_BLOCK_V))](
            base, code, w2, logits, vocab, rank, BLOCK_V=BIAS_BLOCK_V, BLOCK_R=min(64, triton_launch.next_power_of_2(rank)))
        block = triton_launch.vocab_block(vocab)
        if sampling.greedy:
            kernels.argmax_kernel[(bs,)](logits, tokens, vocab, BLOCK_V=block)
        else:
            kernels.softmax_sample_kernel[(bs,)](logits, uniforms.float().contiguous(), tokens, vocab,
                                                 float(sampling.temperature), BLOCK_V=block)
    return tokens, logits


def triton_supports(sampling: SamplingParams) -> bool:
    return sampling.top_k == 0 and sampling.top_p == 1.0


def check_step(base_logits, code, w2, sampling, uniforms) -> tuple[int, int]:
    if not triton_supports(sampling):
        raise ValueError(f"markov_sample_step_triton samples with a temperature only; top_k={sampling.top_k}, "
                         f"top_p={sampling.top_p} need markov_sample_step_torch")
    if base_logits.dim() != 2 or code.dim() != 2 or w2.dim() != 2:
        raise ValueError(f"base_logits [bs, vocab], code [bs, rank] and w2 [vocab, rank] expected, got "
                         f"{tuple(base_logits.shape)}, {tuple(code.shape)}, {tuple(w2.shape)}")
    bs, vocab = base_logits.shape
    if code.shape[0] != bs or tuple(w2.shape) != (vocab, code.shape[1]):
        raise ValueError(f"code must be [{bs}, rank] and w2 [{vocab}, rank], got {tuple(code.shape)} and "
                         f"{tuple(w2.shape)}")
    if not sampling.greedy and (uniforms is None or tuple(uniforms.shape) != (bs,)):
        raise ValueError(f"sampling needs uniforms [{bs}], got {None if uniforms is None else tuple(uniforms.shape)}")
    return bs, vocab
