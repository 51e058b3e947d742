"""Verification-length allocation: how many of its gamma drafts each request sends to the target this round.

Request r drafted d_{r,1..gamma} with conditional confidences c_{r,j} = P(d_j accepted | d_<j accepted). Its
survival a_{r,j} = prod_{i<=j} c_{r,i} is the probability that d_1..d_j are all accepted, so verifying l_r drafts
is expected to commit tau_r = 1 + sum_{j<=l_r} a_{r,j} tokens (the 1 is the correction/bonus token), and the
verify forward carries B = sum_r (1 + l_r) tokens. With SPS(B) target forwards per second (kernels/sps.py), the
expected goodput is Theta = tau * SPS(B), tau = sum_r tau_r.

Candidates. (r, j) for floor_r < j <= cap_r, ordered by a_{r,j} descending; ties keep request-major order with j
increasing (a stable sort of the row-major flattening). a is non-increasing in j, so admitting candidates in
this order always admits a prefix of each request's block, and the rank of (r, j) depends only on a_{r,<=j} and
the other requests' survivals, never on c_{r,j+1..gamma}. floor_r = min(min_length, cap_r) drafts are always
verified; cap_r = min(max_length_r, gamma).

Policies:
  causal    paper Algorithm 1. Start at B0 = R + sum floor, tau0, Theta0 = tau0 * SPS(B0); admit candidates in
            order while each admission strictly raises Theta (B <- B+1, tau <- tau + a), stop at the first that
            does not. The stop is decided before any later candidate is looked at, so admitting d_{r,k} never
            depends on d_{r,k} itself (through c_{r,k+1}): lossless (paper Appendix A; a search over all B
            without the stop is not).
  lagged    paper §5.2. The budget K = argmax_B Theta(B) of a full search (no early stop) over survivals from
            confidences at least one round old (`lagged_confidence`), which cannot depend on this round's drafts;
            then the first K candidates of this round's order are admitted (a top-K by current survival).
  threshold d_j is eligible while every c_{r,i<=j} >= threshold (on="confidence") or a_{r,j} >= threshold
            (on="survival"): a static confidence threshold, as in EAGLE-2/DeepSpec.
  fixed     every draft up to the cap: the DeepSpec evaluation protocol.
  mtp1      one draft per request.
All policies then respect max_batch_tokens (B <= it, floors always kept) by admitting in candidate order; with
`sps`, its max_batch_tokens also applies. Each policy reads only drafter outputs, never the target's verdict.

causal and lagged run as `confidence_admission_torch` (the reference) or `confidence_admission_triton`
(kernels/jit/allocate.py: a stable rank per candidate, the goodput curve, the causal stop or the global
argmax), picked by device (kernels/triton_launch.py) and tested equal. The Triton path never reads a value
back to the host: its lengths stay on the device for the verify layout.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from dspark.kernels import triton_launch
from dspark.kernels.sps import SpsTable
POLICIES = ("causal", "lagged", "threshold", "fixed", "mtp1")  # the algorithms; settings: models/decoding/settings.py
IntOrPerRequest = Union[int, torch.Tensor]  # a scalar, or [R] long


def allocate_verify_lengths(
    confidence: torch.Tensor,  # [R, gamma] conditional confidences c in [0, 1]
    sps: Optional[SpsTable] = None,  # needed by causal and lagged
    policy: str = "causal",
    *,
    lagged_confidence: Optional[torch.Tensor] = None,  # lagged: [R, gamma], at least one round old
    threshold: Optional[float] = None,  # threshold
    threshold_on: str = "survival",  # threshold: "survival" (a_j) or "confidence" (each c_i)
    min_length: int = 0,
    max_length: Optional[IntOrPerRequest] = None,  # e.g. each request's remaining token budget
    max_batch_tokens: Optional[int] = None,
) -> torch.Tensor:
    """l_r in 0..gamma for each request (module docstring): [R] long on confidence's device."""
    check_confidence(confidence, "confidence")
    R, gamma = confidence.shape
    device = confidence.device
    survival = confidence.double().cumprod(dim=1)
    cap = torch.full((R,), gamma, dtype=torch.long, device=device)
    if max_length is not None:
        cap = torch.as_tensor(max_length, device=device).long().expand(R).clamp(0, gamma)
    if min_length < 0:
        raise ValueError(f"min_length must be >= 0, got {min_length}")
    floor = cap.clamp(max=min_length)
    slot = torch.arange(1, gamma + 1, device=device)  # j
    in_range = (slot > floor[:, None]) & (slot <= cap[:, None])
    token_cap = min(t for t in (max_batch_tokens, sps.max_batch_tokens if sps else None, 2**62) if t is not None)

    if policy in ("causal", "lagged"):
        if sps is None:
            raise ValueError(f"the {policy} policy needs an SPS table (--sps-table; `dspark profile-sps` writes one)")
        lagged = None
        if policy == "lagged":
            if lagged_confidence is None:
                raise ValueError("the lagged policy needs lagged_confidence (confidences from an earlier round)")
            check_confidence(lagged_confidence, "lagged_confidence")
            if lagged_confidence.shape != confidence.shape:
                raise ValueError(f"lagged_confidence has shape {tuple(lagged_confidence.shape)}, confidence "
                                  f"{tuple(confidence.shape)}: one row per request, gamma={gamma} positions each")
            lagged = lagged_confidence.to(device).double().cumprod(dim=1)
        admit = confidence_admission_triton if triton_launch.use_triton(confidence) else confidence_admission_torch
        return admit(survival=survival, lagged_survival=lagged, floor=floor, in_range=in_range, sps=sps,
                     token_cap=token_cap)
    eligible = in_range & policy_eligible(policy, confidence, survival, slot, threshold, threshold_on)
    order, _ = admission_order(survival, eligible)
    return admitted_lengths(order, order.numel(), floor, gamma, token_cap)


def confidence_admission_torch(*, survival: torch.Tensor, lagged_survival: Optional[torch.Tensor],
                               floor: torch.Tensor, in_range: torch.Tensor, sps: SpsTable, token_cap: int) -> torch.Tensor:
    """causal (lagged_survival None) or lagged admission. survival, lagged_survival: [R, gamma] float64
    cumulative products; floor: [R] long; in_range: [R, gamma] bool (floor < j <= cap). -> lengths [R] long."""
    order, values = admission_order(survival, in_range & (survival > 0))
    if lagged_survival is None:
        n_admit = causal_admissions(survival, floor, values, sps, token_cap)
    else:
        _, lagged_values = admission_order(lagged_survival, in_range & (lagged_survival > 0))
        n_admit = min(budget_by_global_search(lagged_survival, floor, lagged_values, sps, token_cap), values.numel())
    return admitted_lengths(order, n_admit, floor, survival.shape[1], token_cap)


def confidence_admission_triton(*, survival: torch.Tensor, lagged_survival: Optional[torch.Tensor],
                                floor: torch.Tensor, in_range: torch.Tensor, sps: SpsTable, token_cap: int) -> torch.Tensor:
    kernels = triton_launch.load("allocate", survival)
    R, gamma = survival.shape
    base_batch = (R + floor.sum()).reshape(1)
    ranks, count = stable_descending_ranks(kernels, survival, in_range)
    if lagged_survival is None:
        n_admit = device_goodput_search(kernels, survival, floor, ranks, count, base_batch, sps, token_cap, causal=True)
    else:
        lagged_ranks, lagged_count = stable_descending_ranks(kernels, lagged_survival, in_range)
        n_admit = torch.minimum(device_goodput_search(kernels, lagged_survival, floor, lagged_ranks, lagged_count,
                                                      base_batch, sps, token_cap, causal=False), count)
    n_admit = n_admit.clamp(min=0).minimum(token_cap - base_batch)
    return floor + (ranks.view(R, gamma) < n_admit).sum(dim=1)


def stable_descending_ranks(kernels, survival: torch.Tensor, in_range: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each candidate's rank in admission order [R * gamma] long, the eligible count [1] long); on device."""
    keys = survival.masked_fill(~(in_range & (survival > 0)), -1.0).flatten().contiguous()
    ranks = torch.empty_like(keys, dtype=torch.long)
    if keys.numel():
        kernels.admission_rank_kernel[(triton_launch.cdiv(keys.numel(), RANK_BLOCK),)](
            keys, ranks, keys.numel(), BLOCK_I=RANK_BLOCK, BLOCK_J=RANK_BLOCK)
    return ranks, (keys >= 0).sum().reshape(1)


def device_goodput_search(kernels, survival, floor, ranks, count, base_batch, sps: SpsTable, token_cap: int, *,
                          causal: bool) -> torch.Tensor:
    """Admissions by Algorithm 1's stop (causal) or by the global argmax of Theta: [1] long on device."""
    R, gamma = survival.shape
    device = survival.device
    in_floor = torch.arange(1, gamma + 1, device=device) <= floor[:, None]
    tau0 = (R + (survival * in_floor).sum()).reshape(1)
    keys = survival.masked_fill(ranks.view(R, gamma) >= count, 0.0).flatten()
    in_order = torch.zeros_like(keys).scatter_(0, ranks, keys)  # rank -> survival
    probes = torch.tensor(sps.sample_batch_tokens, dtype=torch.long, device=device)
    steps = torch.tensor(sps.sample_steps_per_sec, dtype=torch.float64, device=device)
    theta = torch.empty(keys.numel() + 1, dtype=torch.float64, device=device)
    out = torch.empty(1, dtype=torch.long, device=device)
    N, block = keys.numel(), min(SCAN_BLOCK, triton_launch.next_power_of_2(keys.numel()))
    kernels.goodput_curve_kernel[(1,)](in_order, count, tau0, base_batch, probes, steps, theta, N, len(probes),
                                       BLOCK=block)
    search = kernels.causal_stop_kernel if causal else kernels.global_best_kernel
    search[(1,)](theta, count, base_batch, token_cap, out, N, BLOCK=block)
    return out


RANK_BLOCK = 64  # candidates per rank program, and per inner comparison chunk
SCAN_BLOCK = 1024  # candidates per chunk of the single-program goodput scan


def admitted_lengths(order: torch.Tensor, n_admit: int, floor: torch.Tensor, gamma: int, token_cap: int) -> torch.Tensor:
    """floor + the first n_admit candidates of `order` (flat r*gamma + j-1), within the token cap: [R] long."""
    R = floor.shape[0]
    n_admit = max(0, min(n_admit, token_cap - R - int(floor.sum())))
    admitted_rows = torch.div(order[:n_admit], gamma, rounding_mode="floor")
    return floor + torch.bincount(admitted_rows, minlength=R)


def check_confidence(confidence: torch.Tensor, name: str) -> None:
    if confidence.dim() != 2 or not confidence.is_floating_point():
        raise ValueError(f"{name} must be a float tensor [requests, gamma], got {confidence.dtype} "
                          f"{tuple(confidence.shape)}")
    if torch.isnan(confidence).any():
        raise ValueError(f"{name} contains NaN")
    if ((confidence < 0) | (confidence > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1] (conditional probabilities, not logits), got values in "
                          f"[{confidence.min().item():.4g}, {confidence.max().item():.4g}]")


def admission_order(survival: torch.Tensor, eligible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eligible candidates in admission order: (flat indices r*gamma + j-1, their survivals), each [N]."""
    flat = survival.masked_fill(~eligible, -1.0).flatten()
    values, order = torch.sort(flat, descending=True, stable=True)
    n = int(eligible.sum())
    return order[:n], values[:n]


def goodput_curve(survival, floor, values, sps: SpsTable) -> tuple[torch.Tensor, torch.Tensor]:
    """(Theta_i, B_i) after admitting the first i = 0..N candidates: each [N+1]."""
    R = survival.shape[0]
    in_floor = torch.arange(1, survival.shape[1] + 1, device=survival.device) <= floor[:, None]
    tau0 = R + (survival * in_floor).sum()
    tau = tau0 + torch.cat([values.new_zeros(1), values.cumsum(0)])
    batch = R + int(floor.sum()) + torch.arange(values.numel() + 1, device=survival.device)
    return tau * sps.lookup(batch), batch


def causal_admissions(survival, floor, values, sps: SpsTable, token_cap: int) -> int:
    """Algorithm 1: the length of the leading run of admissions that each strictly raise Theta within the cap."""
    theta, batch = goodput_curve(survival, floor, values, sps)
    raises = (theta[1:] > theta[:-1]) & (batch[1:] <= token_cap)
    return int(raises.long().cumprod(0).sum())


def budget_by_global_search(survival, floor, values, sps: SpsTable, token_cap: int) -> int:
    """The number of admissions that maximises Theta over every batch size within the cap (first on ties)."""
    theta, batch = goodput_curve(survival, floor, values, sps)
    over_cap = batch > token_cap
    over_cap[0] = False  # the floors alone are always a plan
    return int(theta.masked_fill(over_cap, float("-inf")).argmax())


def policy_eligible(policy, confidence, survival, slot, threshold, threshold_on) -> torch.Tensor:
    """[R, gamma] bool: the positions the static policies would verify (before floors, caps and the token cap)."""
    if policy == "fixed":
        return torch.ones_like(confidence, dtype=torch.bool)
    if policy == "mtp1":
        return (slot <= 1).expand_as(confidence)
    if policy == "threshold":
        if threshold is None or not 0 <= threshold <= 1:
            raise ValueError(f"the threshold policy needs a threshold in [0, 1], got {threshold}")
        if threshold_on not in ("survival", "confidence"):
            raise ValueError(f"threshold_on must be survival or confidence, got {threshold_on!r}")
        if threshold_on == "survival":
            return survival >= threshold
        return (confidence >= threshold).long().cumprod(dim=1).bool()
    raise ValueError(f"unknown allocation policy {policy!r}; choose one of {', '.join(POLICIES)}")
