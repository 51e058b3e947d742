"""Triton bodies of the confidence-aware admission on device (host side and the math: dspark.kernels.allocate).

Dims: N = R * gamma flattened candidates, P SPS probes. Survivals, tau and Theta are float64 throughout, as in
the reference. No kernel reads anything back to the host: counts travel as 1-element device tensors.
"""
import triton
import triton.language as tl


@triton.jit
def admission_rank_kernel(
    keys_ptr,  # [N] float64: survival of an eligible candidate, -1 for the others
    ranks_ptr,  # [N] int64 out: position in the stable descending sort (ties keep flat index order)
    N,
    BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr,
):
    offs_i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    key_i = tl.load(keys_ptr + offs_i, mask=offs_i < N, other=-2.0)
    rank = tl.zeros((BLOCK_I,), tl.int64)
    for start in range(0, N, BLOCK_J):
        offs_j = start + tl.arange(0, BLOCK_J)
        key_j = tl.load(keys_ptr + offs_j, mask=offs_j < N, other=-3.0)
        before = (key_j[None, :] > key_i[:, None]) | ((key_j[None, :] == key_i[:, None]) & (offs_j[None, :] < offs_i[:, None]))
        rank += tl.sum(before.to(tl.int64), axis=1)
    tl.store(ranks_ptr + offs_i, rank, mask=offs_i < N)


@triton.jit
def sps_lookup(batch, probes_ptr, sps_ptr, P):
    """SPS at each batch size: the value of the largest probe <= batch, clamped to the first and last probes."""
    below = tl.zeros(batch.shape, tl.int64)
    for p in range(0, P):
        below += (tl.load(probes_ptr + p) <= batch).to(tl.int64)
    return tl.load(sps_ptr + tl.minimum(tl.maximum(below - 1, 0), P - 1))


@triton.jit
def goodput_curve_kernel(
    sorted_ptr,  # [N] float64: survivals in admission order (the first n are the candidates)
    count_ptr,  # [1] int64: n, the eligible candidates
    tau0_ptr,  # [1] float64: tau of the floors alone
    base_batch_ptr,  # [1] int64: B0 = R + sum of floors
    probes_ptr,  # [P] int64 SPS probe batch sizes
    sps_ptr,  # [P] float64 SPS at each probe
    theta_ptr,  # [N + 1] float64 out: Theta_i = tau_i * SPS(B0 + i) for i = 0..n
    N, P,
    BLOCK: tl.constexpr,
):
    n = tl.load(count_ptr)
    tau0 = tl.load(tau0_ptr)
    base = tl.load(base_batch_ptr)
    tl.store(theta_ptr, tau0 * sps_lookup(base + tl.zeros((1,), tl.int64), probes_ptr, sps_ptr, P).sum(axis=0))
    running = tl.zeros((), tl.float64)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        values = tl.load(sorted_ptr + offs, mask=offs < n, other=0.0)
        tau = tau0 + (running + tl.cumsum(values, axis=0))
        theta = tau * sps_lookup(base + offs + 1, probes_ptr, sps_ptr, P)
        tl.store(theta_ptr + offs + 1, theta, mask=offs < n)
        running += tl.sum(values, axis=0)


@triton.jit
def causal_stop_kernel(
    theta_ptr,  # [N + 1] float64 from goodput_curve_kernel
    count_ptr,  # [1] int64: n
    base_batch_ptr,  # [1] int64: B0
    token_cap,  # int: the largest verify batch
    admit_ptr,  # [1] int64 out: the leading run of admissions that each strictly raise Theta within the cap
    N,
    BLOCK: tl.constexpr,
):
    n = tl.load(count_ptr)
    base = tl.load(base_batch_ptr)
    first_stop = n
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)  # admission offs + 1 moves Theta_offs -> Theta_{offs+1}
        live = offs < n
        theta_prev = tl.load(theta_ptr + offs, mask=live, other=0.0)
        theta = tl.load(theta_ptr + offs + 1, mask=live, other=0.0)
        stops = live & ((theta <= theta_prev) | (base + offs + 1 > token_cap))
        first_stop = tl.minimum(first_stop, tl.min(tl.where(stops, offs, n), axis=0))
    tl.store(admit_ptr, first_stop)


@triton.jit
def global_best_kernel(
    theta_ptr,  # [N + 1] float64 from goodput_curve_kernel
    count_ptr,  # [1] int64: n
    base_batch_ptr,  # [1] int64: B0
    token_cap,  # int: the largest verify batch (admission count 0 is always a plan)
    best_ptr,  # [1] int64 out: argmax_i Theta_i over the plans within the cap, the first on ties
    N,
    BLOCK: tl.constexpr,
):
    n = tl.load(count_ptr)
    base = tl.load(base_batch_ptr)
    best = tl.load(theta_ptr)
    best_index = tl.zeros((), tl.int64)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = (offs < n) & (base + offs + 1 <= token_cap)
        theta = tl.load(theta_ptr + offs + 1, mask=live, other=float("-inf"))
        chunk_best = tl.max(theta, axis=0)
        better = chunk_best > best
        best_index = tl.where(better, tl.argmax(theta, axis=0).to(tl.int64) + start + 1, best_index)
        best = tl.where(better, chunk_best, best)
    tl.store(best_ptr, best_index)
