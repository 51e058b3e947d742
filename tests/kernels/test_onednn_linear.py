"""oneDNN's CPU linear (kernels/onednn_linear.py) against its reference, F.linear."""
import pytest
import torch
import torch.nn.functional as F

from dspark.kernels import onednn_linear as module
from dspark.kernels.onednn_linear import available, onednn_linear, onednn_wins_up_to, pack

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no oneDNN CPU linear")


@pytest.mark.parametrize("shape", [(1, 96), (7, 96), (3, 5, 96), (130, 96)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_equals_the_reference(shape, with_bias):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1000, 96, generator=generator)
    bias = torch.randn(1000, generator=generator) if with_bias else None
    x = torch.randn(*shape, generator=generator)
    out = onednn_linear(x, pack(weight), bias)
    assert out.shape == (*shape[:-1], 1000)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_takes_a_non_contiguous_input():
    weight, x = torch.randn(50, 16), torch.randn(16, 4).t()  # [4, 16], transposed storage
    torch.testing.assert_close(onednn_linear(x, pack(weight)), F.linear(x, weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_pack_refuses_anything_but_float32(dtype):
    with pytest.raises(ValueError, match=f"float32 CPU weight, got {dtype}"):
        pack(torch.randn(8, 4, dtype=dtype))


@pytest.mark.parametrize("onednn_seconds_per_row, expected", [
    ({1: 1, 8: 1, 64: 9, 256: 1}, 8),  # loses at 64: the counts after it do not matter
    ({1: 1, 8: 1, 64: 1, 256: 1}, 256),
    ({1: 9, 8: 1, 64: 1, 256: 1}, 0),
    ({1: 2, 8: 1, 64: 1, 256: 1}, 0),  # a tie is not a win
])
def test_the_probe_finds_how_far_onednn_wins(monkeypatch, onednn_seconds_per_row, expected):
    """A fake clock each product advances by its cost at that row count; the default path costs 2 everywhere."""
    now = [0.0]

    def costing(seconds_at, product):
        def timed(x, *args):
            now[0] += seconds_at(x.shape[0])
            return product(x, *args)
        return timed

    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(module.F, "linear", costing(lambda rows: 2, F.linear))
    monkeypatch.setattr(module, "onednn_linear", costing(onednn_seconds_per_row.get, onednn_linear))
    assert onednn_wins_up_to(torch.randn(8, 4), (256, 1, 64, 8)) == expected  # any order: probed ascending


def test_without_onednn_the_probe_keeps_the_default(monkeypatch):
    monkeypatch.setattr(module, "available", lambda: False)
    assert onednn_wins_up_to(torch.randn(8, 4), (1,)) == 0


def test_the_probe_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    onednn_wins_up_to(torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), (1, 2), repeats=1)
    assert torch.equal(torch.rand(3), expected)
