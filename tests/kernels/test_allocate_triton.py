"""confidence_admission_triton (causal and lagged on device) equals confidence_admission_torch.

Random confidences, SPS curves (decreasing, jagged, flat), floors, per-request caps and token caps; plus the
paper's Appendix A case and an empty candidate set. allocate_verify_lengths dispatches CUDA tensors to it.
"""
import pytest
import torch

from dspark.kernels.allocate import confidence_admission_torch, confidence_admission_triton
from dspark.kernels.sps import SpsTable


def admission_case(R, gamma, seed, device, *, shape="decreasing", min_length=0):
    g = torch.Generator().manual_seed(seed)
    survival = torch.rand(R, gamma, generator=g).double().cumprod(1)
    lagged = torch.rand(R, gamma, generator=g).double().cumprod(1)
    probes = sorted(set(torch.randint(1, 4 * R * (gamma + 1), (6,), generator=g).tolist()))
    values = torch.rand(len(probes), generator=g).add(0.05).tolist()
    if shape == "decreasing":
        values = sorted(values, reverse=True)
    elif shape == "flat":
        values = [1.0] * len(probes)
    sps = SpsTable(tuple(probes), tuple(values), probes[-1] + int(torch.randint(0, 8, (1,), generator=g)))
    cap = torch.randint(0, gamma + 1, (R,), generator=g)
    floor = cap.clamp(max=min_length)
    slot = torch.arange(1, gamma + 1)
    in_range = (slot > floor[:, None]) & (slot <= cap[:, None])
    token_cap = int(torch.randint(R, R * (gamma + 1) + 2, (1,), generator=g))
    return dict(survival=survival.to(device), floor=floor.to(device), in_range=in_range.to(device), sps=sps,
                token_cap=min(token_cap, sps.max_batch_tokens)), lagged.to(device)


@pytest.mark.parametrize("shape", ["decreasing", "jagged", "flat"])
@pytest.mark.parametrize("policy", ["causal", "lagged"])
def test_device_admission_equals_reference(shape, policy, device):
    for seed in range(12):
        R, gamma = 1 + seed % 9, 1 + (seed * 5) % 8
        case, lagged = admission_case(R, gamma, seed, device, shape=shape, min_length=seed % 3)
        case["lagged_survival"] = lagged if policy == "lagged" else None
        reference = confidence_admission_torch(**case)
        kernel = confidence_admission_triton(**case)
        assert torch.equal(kernel.cpu(), reference.cpu()), (seed, reference, kernel)


def test_appendix_a_stops_before_the_cliff(device):
    sps = SpsTable((1, 2, 3), (1.0, 0.5, 0.45), 3)
    for c2 in (0.9, 0.0):
        survival = torch.tensor([[0.8, 0.8 * c2]], dtype=torch.float64, device=device)
        case = dict(survival=survival, lagged_survival=None, floor=torch.zeros(1, dtype=torch.long, device=device),
                    in_range=torch.ones(1, 2, dtype=torch.bool, device=device), sps=sps, token_cap=3)
        assert confidence_admission_triton(**case).tolist() == [0]


def test_no_candidates_verifies_the_floors(device):
    case = dict(survival=torch.zeros(3, 4, dtype=torch.float64, device=device), lagged_survival=None,
                floor=torch.tensor([1, 0, 2], device=device), in_range=torch.zeros(3, 4, dtype=torch.bool, device=device),
                sps=SpsTable((1, 8), (2.0, 1.0), 16), token_cap=16)
    assert confidence_admission_triton(**case).tolist() == [1, 0, 2]
