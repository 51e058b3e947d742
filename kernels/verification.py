"""Chain verification of per-request draft blocks: the rule that makes speculative decoding lossless.

Request b proposed d_1..d_k (k = lengths[b] <= K; entries past k are padding). One target forward over
[anchor, d_1..d_k] gives the target's warped distributions p_1..p_{k+1} (p_i is the next-token distribution
after d_{i-1}; p_1 follows the anchor). The drafter drew d_i from q_i.

Greedy (T = 0): d_i is accepted iff d_i = argmax p_i and every earlier draft was accepted. With n accepted, the
next token is argmax p_{n+1}: the target's own correction when n < k, its bonus token when n = k.

Sampling (Leviathan et al. 2023; DEEPSPEC_REFERENCE §3.2): with u_i ~ U(0, 1),
    accept d_i  iff  u_i < min(1, p_i(d_i) / q_i(d_i))   and every earlier draft was accepted;
    n = the accepted prefix length;
    next ~ norm(max(p_{n+1} - q_{n+1}, 0))  if n < k   (the residual; p_{n+1} itself if the residual is all zero,
                                                          which happens only when p_{n+1} = q_{n+1})
    next ~ p_{k+1}                           if n = k   (the bonus token).
Then each emitted token has exactly distribution p: P(emit x at i) = q(x) min(1, p(x)/q(x)) + P(reject) r(x)
= min(q, p)(x) + (1 - sum min(q, p)) max(p - q, 0)(x) / sum max(p - q, 0) = p(x), since
sum max(p - q, 0) = 1 - sum min(q, p). Choosing k per request before looking at the target (a fixed length, a
confidence threshold, an allocator) does not change this: it only decides how many of these steps run.

This is the readable reference; dspark.kernels' fast kernels are tested against it.
"""
from dataclasses import dataclass
from typing import Optional

import torch

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
    target_tokens = target_logits.argmax(dim=-1)  # [bs, K+1]
    accepted = prefix_length(draft_tokens == target_tokens[:, :-1], lengths)
    return Verdict(accepted, target_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1))


def verify_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                   lengths: torch.Tensor, generator: Optional[torch.Generator] = None, *,
                   uniforms: Optional[torch.Tensor] = None, final_uniforms: Optional[torch.Tensor] = None) -> Verdict:
    """target_probs: [bs, K+1, vocab] warped p; draft_probs: [bs, K, vocab] the q each draft was drawn from;
    draft_tokens: [bs, K] long; lengths: [bs] long in [0, K]. Rows of p and q sum to 1.

    The randomness is u_i (`uniforms` [bs, K]) for the acceptance tests and one more uniform per request
    (`final_uniforms` [bs]) that samples the next token by inverse CDF: the first x whose cumulative residual
    mass exceeds u * total. Both are drawn from `generator` unless given, so kernels can be checked against
    this reference on the same uniforms."""
    bs, K = draft_tokens.shape
    device = draft_tokens.device
    u = torch.rand(bs, K, generator=generator, device=device) if uniforms is None else uniforms
    u_final = torch.rand(bs, generator=generator, device=device) if final_uniforms is None else final_uniforms
    p_draft = target_probs[:, :K].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # p_i(d_i)
    q_draft = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # q_i(d_i)
    # u < p/q without dividing by a tiny q; a token its own q gives no mass was not drawn from q: rejected
    accepted = prefix_length((q_draft > 0) & (u * q_draft < p_draft), lengths)

    rows = torch.arange(bs, device=draft_tokens.device)
    p_next = target_probs[rows, accepted]  # [bs, vocab]
    q_next = torch.cat([draft_probs, target_probs.new_zeros(bs, 1, target_probs.shape[2])], dim=1)[rows, accepted]
    rejected = (accepted < lengths).unsqueeze(1)
    residual = torch.where(rejected, (p_next - q_next).clamp(min=0), p_next)
    mass = residual.sum(dim=1, keepdim=True)
    residual = torch.where(mass > RESIDUAL_EPS, residual, p_next)
    return Verdict(accepted, sample_inverse_cdf(residual, u_final))


def sample_inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """weights: [bs, vocab] >= 0 (unnormalised); uniforms: [bs] in [0, 1) -> [bs] long, x ~ weights / sum."""
    cumulative = weights.cumsum(dim=1)
    threshold = (uniforms * cumulative[:, -1]).unsqueeze(1)
    return (cumulative <= threshold).sum(dim=1).clamp(max=weights.shape[1] - 1)
