"""SGLang's chain speculative sampling (`chain_speculative_sampling_triton`) for CPU tensors.

SGLang's DSPARK accept step calls its Triton chain kernel even on its "torch" branch, and Triton has no
CPU driver. This is the same operation on dspark's PyTorch reference (`dspark.kernels.verification`),
in the kernel's own calling convention, for a chain of D = γ + 1 slots per request:

    candidates [bs, D]        slot 0 is the anchor, slots 1..γ the draft tokens
    retrive_index [bs, D]     where slot s of request b lives in the flat `predicts` [bs * D]
    target_probs [bs, D, V]   p after each slot;  draft_probs [bs, >=γ, V]  q of each draft token
    uniform_samples [bs, >=γ] the acceptance coins; uniform_samples_for_final_sampling [bs]
  outputs (written in place):
    accept_token_num[b] = n, the accepted draft prefix;  accept_index[b, 0..n] = retrive_index[b, 0..n]
    predicts[retrive_index[b, s-1]] = candidates[b, s] for s <= n, predicts[retrive_index[b, n]] = the
    residual sample (n < γ) or bonus token (n = γ).
Like the Triton kernel, `threshold_single`/`threshold_acc` and `deterministic` are ignored (SGLang
passes 1.0 / True). Block verification (`block_verification=True`) is not implemented here and says so.
"""
from __future__ import annotations

import torch

from dspark.kernels.verification import verify_sampled


def chain_speculative_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                               retrive_next_token, retrive_next_sibling, uniform_samples,
                               uniform_samples_for_final_sampling, target_probs, draft_probs,
                               threshold_single=1.0, threshold_acc=1.0, deterministic=True, *,
                               block_verification: bool = False) -> None:
    if block_verification:
        raise NotImplementedError(
            "dspark's CPU chain speculative sampling does not implement block verification "
            "(--speculative-use-block-verification); it runs on CUDA only")
    batch_size, slots = candidates.shape
    gamma = slots - 1
    verdict = verify_sampled(
        target_probs[:, :slots].float(), draft_probs[:, :gamma].float(), candidates[:, 1:].long(),
        torch.full((batch_size,), gamma, dtype=torch.long, device=candidates.device),
        uniforms=uniform_samples[:, :gamma].float(), final_uniforms=uniform_samples_for_final_sampling.float())
    accepted, next_token = verdict.accepted, verdict.next_token

    steps = torch.arange(slots, device=candidates.device)
    in_prefix = steps[None, :] <= accepted[:, None]                           # slots 0..n
    accept_index[:, :slots] = torch.where(in_prefix, retrive_index.to(accept_index.dtype), accept_index[:, :slots])
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
    # slot s-1's prediction is draft token s (accepted ones), then the final token at slot n.
    emitted = torch.cat([candidates[:, 1:], candidates[:, :1]], dim=1).long()
    emitted = emitted.scatter(1, accepted[:, None], next_token[:, None])
    predicts[retrive_index[in_prefix].long()] = emitted[in_prefix].to(predicts.dtype)
