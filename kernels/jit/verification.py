"""Triton bodies of ragged chain verification (host side and the math: dspark.kernels.verification).

Dims: bs requests, K draft slots (the padded block width), vocab. One program per request (the argmax kernel:
per request and slot). Probabilities are read as float32; sums over the vocabulary run in float64 so the
inverse-CDF sample equals the reference's float64 cumsum (both differ only below float64 rounding).
"""
import triton
import triton.language as tl


@triton.jit
def chunked_argmax(row, vocab, live, BLOCK_V: tl.constexpr):
    """argmax of row[0:vocab] (first index on ties, as torch.argmax), BLOCK_V at a time; 0 when not live."""
    best = tl.full((), float("-inf"), tl.float32)
    best_index = tl.zeros((), tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row + offs, mask=(offs < vocab) & live, other=float("-inf")).to(tl.float32)
        chunk_max = tl.max(x, axis=0)
        better = chunk_max > best  # strict: an equal later maximum keeps the earlier index
        best_index = tl.where(better, tl.argmax(x, axis=0).to(tl.int64) + start, best_index)
        best = tl.where(better, chunk_max, best)
    return best_index


@triton.jit
def row_argmax_kernel(
    logits_ptr,  # [bs, K+1, vocab] float (any float dtype), contiguous
    lengths_ptr,  # [bs] int64: slots past lengths[b] are skipped
    out_ptr,  # [bs, K+1] int64: argmax of each needed slot
    K, vocab,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    slot = tl.program_id(1)
    needed = slot <= tl.load(lengths_ptr + b)
    row = logits_ptr + (b * (K + 1) + slot).to(tl.int64) * vocab
    tl.store(out_ptr + b * (K + 1) + slot, chunked_argmax(row, vocab, needed, BLOCK_V))


@triton.jit
def greedy_accept_kernel(
    target_tokens_ptr,  # [bs, K+1] int64, argmax of each slot
    draft_tokens_ptr,  # [bs, K] int64
    lengths_ptr,  # [bs] int64 in [0, K]
    accepted_ptr,  # [bs] int64 out: n
    next_token_ptr,  # [bs] int64 out: target_tokens[b, n]
    K,
    BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0)
    length = tl.load(lengths_ptr + b)
    offs = tl.arange(0, BLOCK_K)
    in_block = offs < length
    drafts = tl.load(draft_tokens_ptr + b * K + offs, mask=in_block, other=-1)
    targets = tl.load(target_tokens_ptr + b * (K + 1) + offs, mask=in_block, other=-2)
    first_miss = tl.min(tl.where((drafts == targets) & in_block, BLOCK_K, offs), axis=0)
    accepted = tl.minimum(first_miss, length)
    tl.store(accepted_ptr + b, accepted)
    tl.store(next_token_ptr + b, tl.load(target_tokens_ptr + b * (K + 1) + accepted))


@triton.jit
def sampled_accept_kernel(
    target_probs_ptr,  # [bs, K+1, vocab] float32 p
    draft_probs_ptr,  # [bs, K, vocab] float32 q
    draft_tokens_ptr,  # [bs, K] int64
    lengths_ptr,  # [bs] int64 in [0, K]
    uniforms_ptr,  # [bs, K] float32, the acceptance coins
    final_uniforms_ptr,  # [bs] float32, the inverse-CDF coin of the next token
    accepted_ptr,  # [bs] int64 out: n
    next_token_ptr,  # [bs] int64 out: recovered (n < length) or bonus (n = length) token
    K, vocab, residual_eps,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    length = tl.load(lengths_ptr + b)
    offs_k = tl.arange(0, BLOCK_K)
    in_block = offs_k < length
    drafts = tl.load(draft_tokens_ptr + b * K + offs_k, mask=in_block, other=0)
    p_rows = target_probs_ptr + (b * (K + 1) + offs_k).to(tl.int64) * vocab
    q_rows = draft_probs_ptr + (b * K + offs_k).to(tl.int64) * vocab
    p_draft = tl.load(p_rows + drafts, mask=in_block, other=0.0)
    q_draft = tl.load(q_rows + drafts, mask=in_block, other=0.0)
    u = tl.load(uniforms_ptr + b * K + offs_k, mask=in_block, other=1.0)
    accept = (q_draft > 0) & (u * q_draft < p_draft) & in_block
    accepted = tl.minimum(tl.min(tl.where(accept, BLOCK_K, offs_k), axis=0), length)
    tl.store(accepted_ptr + b, accepted)

    rejected = accepted < length  # then accepted < K and q row `accepted` exists
    p_next = target_probs_ptr + (b * (K + 1) + accepted).to(tl.int64) * vocab
    q_next = draft_probs_ptr + (b * K + accepted).to(tl.int64) * vocab
    residual_mass = tl.zeros((), tl.float64)
    p_mass = tl.zeros((), tl.float64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        p = tl.load(p_next + offs, mask=offs < vocab, other=0.0)
        q = tl.load(q_next + offs, mask=(offs < vocab) & rejected, other=0.0)
        residual_mass += tl.sum(tl.maximum(p - q, 0.0).to(tl.float64), axis=0)
        p_mass += tl.sum(p.to(tl.float64), axis=0)
    # p itself when not rejected (bonus), or when the residual is empty (p == q up to rounding)
    use_residual = rejected & (residual_mass > residual_eps)
    total = tl.where(use_residual, residual_mass, p_mass)
    threshold = tl.load(final_uniforms_ptr + b).to(tl.float64) * total
    running = tl.zeros((), tl.float64)
    below = tl.zeros((), tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        p = tl.load(p_next + offs, mask=offs < vocab, other=0.0)
        q = tl.load(q_next + offs, mask=(offs < vocab) & use_residual, other=0.0)
        weight = tl.maximum(p - q, 0.0).to(tl.float64)
        cumulative = running + tl.cumsum(weight, axis=0)
        below += tl.sum(((cumulative <= threshold) & (offs < vocab)).to(tl.int64), axis=0)
        running += tl.sum(weight, axis=0)
    tl.store(next_token_ptr + b, tl.minimum(below, vocab - 1))
