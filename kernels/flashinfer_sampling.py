"""Per-request draft lengths over FlashInfer's chain speculative sampling, losslessly.

`flashinfer.sampling.chain_speculative_sampling(draft_probs [bs, n, vocab], draft_token_ids [bs, n],
target_probs [bs, n + 1, vocab])` verifies every request over the same n drafts and has no length argument.
Request r verifies only l_r <= gamma of its gamma drafts. We pad (run it at n = gamma) and cap the accepted
count afterwards (SGLang's CapCorrectLen does the same for its own kernel):

    n_full   = FlashInfer's accepted prefix over all gamma drafts (`output_emitted_draft_token_num`)
    accepted = min(n_full, l_r)
    next     = output_token_ids[r, accepted]

Why it is lossless: FlashInfer's output row is one sample of the target's chain, token by token: position i is
the draft d_{i+1} when it passes the test u < p/q, else the recovered sample from norm(max(p - q, 0)) (the
bonus from p after the last draft), and each emitted token has the target's conditional distribution
(kernels/verification.py). A prefix of such a chain is a sample of the shorter chain. Capping at l_r keeps
the first l_r + 1 positions: l_r accepted drafts and token l_r, which is d_{l_r+1} when that draft was also
accepted or the recovered / bonus token otherwise, in both cases distributed as p_{l_r+1}. The drafts past l_r
(and the target's distributions past position l_r + 1, which a compact verify forward never computes and
leaves as padding) only decide whether token l_r is the draft or the recovered sample, never its
distribution, so they may be anything with valid probabilities. Forcing a rejection at l_r instead would
need a token the target gives probability 0, which a real vocabulary does not guarantee.

`cap_chain_output` is the device-agnostic part (tested on CPU against the reference verification); the
FlashInfer call needs CUDA and FlashInfer (tests/kernels on such a machine, and `make gpu-check` where it imports).
"""
from __future__ import annotations

from typing import Optional

import torch

from dspark.kernels.verification import Verdict


def cap_chain_output(*, output_token_ids: torch.Tensor, emitted: torch.Tensor, lengths: torch.Tensor) -> Verdict:
    """output_token_ids [bs, gamma + 1] (-1 past the emitted tokens); emitted [bs] FlashInfer's accepted
    prefix at full width; lengths [bs] in [0, gamma] -> the Verdict of verifying lengths[b] drafts."""
    if output_token_ids.dim() != 2 or emitted.shape != output_token_ids.shape[:1] or lengths.shape != emitted.shape:
        raise ValueError(f"output_token_ids [bs, gamma+1], emitted [bs] and lengths [bs] expected, got "
                         f"{tuple(output_token_ids.shape)}, {tuple(emitted.shape)}, {tuple(lengths.shape)}")
    accepted = torch.minimum(emitted.long(), lengths.long())
    return Verdict(accepted, output_token_ids.long().gather(1, accepted.unsqueeze(1)).squeeze(1))


def verify_sampled_flashinfer(*, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                              lengths: torch.Tensor, generator: Optional[torch.Generator] = None) -> Verdict:
    """Ragged sampled verification on FlashInfer (CUDA): target_probs [bs, gamma+1, vocab], draft_probs
    [bs, gamma, vocab], draft_tokens [bs, gamma], lengths [bs]. FlashInfer draws its own Philox uniforms."""
    from flashinfer.sampling import chain_speculative_sampling

    bs = draft_tokens.shape[0]
    accepted_count = torch.zeros(bs, dtype=torch.int32, device=draft_tokens.device)  # FlashInfer accumulates
    emitted = torch.zeros(bs, dtype=torch.int32, device=draft_tokens.device)
    output, _, emitted = chain_speculative_sampling(
        draft_probs.float().contiguous(), draft_tokens.to(torch.int32).contiguous(), target_probs.float().contiguous(),
        accepted_count, emitted, deterministic=True, generator=generator)
    return cap_chain_output(output_token_ids=output, emitted=emitted, lengths=lengths)
