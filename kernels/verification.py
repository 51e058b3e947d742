"""Chain verification of per-request draft blocks: the rule that makes speculative decoding lossless.

Request b proposed d_1..d_k (k = lengths[b] <= K; entries past k are padding). One target forward over
[anchor, d_1..d_k] gives the target's warped distributions p_1..p_{k+1} (p_i is the next-token distribution
after d_{i-1}; p_1 follows the anchor). The drafter drew d_i from q_i.

Greedy (T = 0): d_i is accepted iff d_i = argmax p_i and every earlier draft was accepted. With n accepted, the
next token is argmax p_{n+1}: the target's own correction when n < k, its bonus token when n = k.

Sampling (Leviathan et al. 2023; docs/evaluation.md): with u_i ~ U(0, 1),
    accept d_i  iff  u_i < min(1, p_i(d_i) / q_i(d_i))   and every earlier draft was accepted;
    n = the accepted prefix length;
    next ~ norm(max(p_{n+1} - q_{n+1}, 0))  if n < k   (the residual; p_{n+1} itself if the residual is all zero,
                                                          which happens only when p_{n+1} = q_{n+1})
    next ~ p_{k+1}                           if n = k   (the bonus token).
Then each emitted token has exactly distribution p: P(emit x at i) = q(x) min(1, p(x)/q(x)) + P(reject) r(x)
= min(q, p)(x) + (1 - sum min(q, p)) max(p - q, 0)(x) / sum max(p - q, 0) = p(x), since
sum max(p - q, 0) = 1 - sum min(q, p). Choosing k per request before looking at the target (a fixed length, a
confidence threshold, an allocator) does not change this: it only decides how many of these steps run.

Each rule has a readable PyTorch reference (`*_torch`) and a Triton kernel (`*_triton`, bodies in
kernels/jit/verification.py) with the same keyword-only signature; `verify_greedy` / `verify_sampled` pick one
by where the tensors live (kernels/triton_launch.py) and own the RNG: the uniforms u_i and the final one are
drawn once, from the caller's generator, so both give the same verdict on the same uniforms (tested).
"""
from dataclasses import dataclass
from typing import Optional

import torch

from dspark.kernels import triton_launch

RESIDUAL_EPS = 1e-8  # a residual with less mass than this is treated as empty (p == q up to rounding)


@dataclass(frozen=True)
class Verdict:
    accepted: torch.Tensor  # [bs] long, n: the accepted prefix length, 0..lengths[b]
    next_token: torch.Tensor  # [bs] long, the correction (n < k) or bonus (n = k) token


def prefix_length(accept: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Length of the all-accepted prefix within each request's first lengths[b] positions.

    accept: [bs, K] bool; lengths: [bs] long -> [bs] long.
    """
    in_block = torch.arange(accept.shape[1], device=accept.device) < lengths.unsqueeze(1)
    return (accept & in_block).long().cumprod(dim=1).sum(dim=1)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor, lengths: torch.Tensor) -> Verdict:
    """target_logits: [bs, K+1, vocab]; draft_tokens: [bs, K] long; lengths: [bs] long in [0, K]."""
    verify = verify_greedy_triton if triton_launch.use_triton(target_logits) else verify_greedy_torch
    return verify(target_logits=target_logits, draft_tokens=draft_tokens, lengths=lengths)


def verify_greedy_torch(*, target_logits: torch.Tensor, draft_tokens: torch.Tensor, lengths: torch.Tensor) -> Verdict:
    target_tokens = target_logits.argmax(dim=-1)  # [bs, K+1]
    accepted = prefix_length(draft_tokens == target_tokens[:, :-1], lengths)
    return Verdict(accepted, target_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1))


def verify_greedy_triton(*, target_logits: torch.Tensor, draft_tokens: torch.Tensor, lengths: torch.Tensor) -> Verdict:
    bs, K = check_block(draft_tokens, lengths, target_logits, "target_logits", K_extra=1)
    kernels = triton_launch.load("verification", target_logits)
    logits, drafts, lengths = target_logits.contiguous(), draft_tokens.long().contiguous(), lengths.long().contiguous()
    target_tokens = torch.empty(bs, K + 1, dtype=torch.long, device=logits.device)
    accepted, next_token = (torch.empty(bs, dtype=torch.long, device=logits.device) for _ in range(2))
    if bs:
        kernels.row_argmax_kernel[(bs, K + 1)](logits, lengths, target_tokens, K, logits.shape[2],
                                              BLOCK_V=triton_launch.vocab_block(logits.shape[2]))
        kernels.greedy_accept_kernel[(bs,)](target_tokens, drafts, lengths, accepted, next_token, K,
                                            BLOCK_K=triton_launch.next_power_of_2(K))
    return Verdict(accepted, next_token)


def verify_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                   lengths: torch.Tensor, generator: Optional[torch.Generator] = None, *,
                   uniforms: Optional[torch.Tensor] = None, final_uniforms: Optional[torch.Tensor] = None) -> Verdict:
    """target_probs: [bs, K+1, vocab] warped p; draft_probs: [bs, K, vocab] the q each draft was drawn from;
    draft_tokens: [bs, K] long; lengths: [bs] long in [0, K]. Rows of p and q sum to 1.

    The randomness is u_i (`uniforms` [bs, K]) for the acceptance tests and one more uniform per request
    (`final_uniforms` [bs]) that samples the next token by inverse CDF: the first x whose cumulative residual
    mass exceeds u * total. Both are drawn from `generator` unless given."""
    bs, K = draft_tokens.shape
    device = draft_tokens.device
    u = torch.rand(bs, K, generator=generator, device=device) if uniforms is None else uniforms
    u_final = torch.rand(bs, generator=generator, device=device) if final_uniforms is None else final_uniforms
    verify = verify_sampled_triton if triton_launch.use_triton(target_probs) else verify_sampled_torch
    return verify(target_probs=target_probs, draft_probs=draft_probs, draft_tokens=draft_tokens, lengths=lengths,
                  uniforms=u, final_uniforms=u_final)


def verify_sampled_torch(*, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                         lengths: torch.Tensor, uniforms: torch.Tensor, final_uniforms: torch.Tensor) -> Verdict:
    bs, K = draft_tokens.shape
    p_draft = target_probs[:, :K].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # p_i(d_i)
    q_draft = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # q_i(d_i)
    # u < p/q without dividing by a tiny q; a token its own q gives no mass was not drawn from q: rejected
    accepted = prefix_length((q_draft > 0) & (uniforms * q_draft < p_draft), lengths)

    rows = torch.arange(bs, device=draft_tokens.device)
    p_next = target_probs[rows, accepted]  # [bs, vocab]
    q_next = torch.cat([draft_probs, target_probs.new_zeros(bs, 1, target_probs.shape[2])], dim=1)[rows, accepted]
    rejected = (accepted < lengths).unsqueeze(1)
    residual = torch.where(rejected, (p_next - q_next).clamp(min=0), p_next)
    mass = residual.double().sum(dim=1, keepdim=True)
    residual = torch.where(mass > RESIDUAL_EPS, residual, p_next)
    return Verdict(accepted, sample_inverse_cdf(residual, final_uniforms))


def verify_sampled_triton(*, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                          lengths: torch.Tensor, uniforms: torch.Tensor, final_uniforms: torch.Tensor) -> Verdict:
    bs, K = check_block(draft_tokens, lengths, target_probs, "target_probs", K_extra=1)
    check_block(draft_tokens, lengths, draft_probs, "draft_probs", K_extra=0)
    if tuple(uniforms.shape) != (bs, K) or tuple(final_uniforms.shape) != (bs,):
        raise ValueError(f"uniforms must be [{bs}, {K}] and final_uniforms [{bs}], got {tuple(uniforms.shape)} "
                         f"and {tuple(final_uniforms.shape)}")
    kernels = triton_launch.load("verification", target_probs)
    p, q = target_probs.float().contiguous(), draft_probs.float().contiguous()
    accepted, next_token = (torch.empty(bs, dtype=torch.long, device=p.device) for _ in range(2))
    if bs:
        kernels.sampled_accept_kernel[(bs,)](
            p, q, draft_tokens.long().contiguous(), lengths.long().contiguous(), uniforms.float().contiguous(),
            final_uniforms.float().contiguous(), accepted, next_token, K, p.shape[2], RESIDUAL_EPS,
            BLOCK_K=triton_launch.next_power_of_2(K), BLOCK_V=triton_launch.vocab_block(p.shape[2]))
    return Verdict(accepted, next_token)


def check_block(draft_tokens: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor, name: str,
                K_extra: int) -> tuple[int, int]:
    """The kernels' shape contract (the host asserts before any launch): -> (bs, K)."""
    if draft_tokens.dim() != 2 or lengths.shape != draft_tokens.shape[:1]:
        raise ValueError(f"draft_tokens must be [bs, K] and lengths [bs], got {tuple(draft_tokens.shape)} and "
                         f"{tuple(lengths.shape)}")
    bs, K = draft_tokens.shape
    if rows.dim() != 3 or tuple(rows.shape[:2]) != (bs, K + K_extra):
        raise ValueError(f"{name} must be [{bs}, {K + K_extra}, vocab], got {tuple(rows.shape)}")
    if len({t.device for t in (draft_tokens, lengths, rows)}) != 1:
        raise ValueError(f"draft_tokens, lengths and {name} must be on one device")
    return bs, K


def sample_inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """weights: [bs, vocab] >= 0 (unnormalised); uniforms: [bs] in [0, 1) -> [bs] long, x ~ weights / sum.

    The cumulative mass is float64 on every device, so kernels that sum in float64 draw the same token."""
    cumulative = weights.double().cumsum(dim=1)
    threshold = (uniforms.double() * cumulative[:, -1]).unsqueeze(1)
    return (cumulative <= threshold).sum(dim=1).clamp(max=weights.shape[1] - 1)
