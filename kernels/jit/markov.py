"""Triton bodies of one Markov drafting step (host side and the math: dspark.kernels.markov).

Dims: bs requests, vocab, rank (the Markov code width). The bias kernel runs one program per (request,
vocabulary chunk); the sampling kernels one program per request, looping over the vocabulary.
"""
import triton
import triton.language as tl

from dspark.kernels.jit.verification import chunked_argmax


@triton.jit
def markov_logits_kernel(
    base_ptr,  # [bs, vocab] base logits U_k
    code_ptr,  # [bs, rank] the Markov code (W1[prev] for the vanilla head)
    w2_ptr,  # [vocab, rank] W2 (nn.Linear(rank, vocab) weight)
    out_ptr,  # [bs, vocab] out: U_k + W2 code, in base's dtype
    vocab, rank,
    BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
):
    b = tl.program_id(0)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    bias = tl.zeros((BLOCK_V,), tl.float32)
    for start in range(0, rank, BLOCK_R):
        offs_r = start + tl.arange(0, BLOCK_R)
        code = tl.load(code_ptr + b * rank + offs_r, mask=offs_r < rank, other=0.0).to(tl.float32)
        w2 = tl.load(w2_ptr + offs_v[:, None].to(tl.int64) * rank + offs_r[None, :],
                     mask=(offs_v[:, None] < vocab) & (offs_r[None, :] < rank), other=0.0).to(tl.float32)
        bias += tl.sum(w2 * code[None, :], axis=1)
    row = b.to(tl.int64) * vocab
    base = tl.load(base_ptr + row + offs_v, mask=offs_v < vocab, other=0.0).to(tl.float32)
    tl.store(out_ptr + row + offs_v, (base + bias).to(out_ptr.dtype.element_ty), mask=offs_v < vocab)


@triton.jit
def argmax_kernel(
    logits_ptr,  # [bs, vocab]
    tokens_ptr,  # [bs] int64 out: first index of the maximum
    vocab,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    tl.store(tokens_ptr + b, chunked_argmax(logits_ptr + b.to(tl.int64) * vocab, vocab, True, BLOCK_V))


@triton.jit
def softmax_sample_kernel(
    logits_ptr,  # [bs, vocab]
    uniforms_ptr,  # [bs] float32
    tokens_ptr,  # [bs] int64 out: inverse-CDF sample of softmax(logits / temperature)
    vocab, temperature,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    row = logits_ptr + b.to(tl.int64) * vocab
    peak = tl.full((), float("-inf"), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32) / temperature
        peak = tl.maximum(peak, tl.max(x, axis=0))
    norm = tl.zeros((), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32) / temperature
        norm += tl.sum(tl.exp(x - peak), axis=0)
    # the probabilities as float32 (as the reference's softmax), their cumulative mass in float64
    total = tl.zeros((), tl.float64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32) / temperature
        total += tl.sum((tl.exp(x - peak) / norm).to(tl.float64), axis=0)
    threshold = tl.load(uniforms_ptr + b).to(tl.float64) * total
    running = tl.zeros((), tl.float64)
    below = tl.zeros((), tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32) / temperature
        weight = (tl.exp(x - peak) / norm).to(tl.float64)
        below += tl.sum(((running + tl.cumsum(weight, axis=0) <= threshold) & (offs < vocab)).to(tl.int64), axis=0)
        running += tl.sum(weight, axis=0)
    tl.store(tokens_ptr + b, tl.minimum(below, vocab - 1))
