"""The CPU linear strategies (kernels/cpu_linear.py) against their reference, F.linear, and the probe."""
import pytest
import torch
import torch.nn.functional as F

from dspark.kernels import cpu_linear as module
from dspark.kernels.cpu_linear import (STRATEGIES, apply_strategy, available_strategies, fastest_strategies,
                                       onednn_available, pack)


def strategies_here():
    return [s if s in available_strategies() else pytest.param(s, marks=pytest.mark.skip("no oneDNN"))
            for s in STRATEGIES]


@pytest.mark.parametrize("strategy", strategies_here())
@pytest.mark.parametrize("shape", [(1, 96), (2, 96), (7, 96), (3, 5, 96), (1, 1, 96), (130, 96)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_strategy_equals_the_reference(strategy, shape, with_bias):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1000, 96, generator=generator)
    bias = torch.randn(1000, generator=generator) if with_bias else None
    x = torch.randn(*shape, generator=generator)
    out = apply_strategy(strategy, x, weight, bias, pack(weight) if strategy == "onednn" else None)
    assert out.shape == (*shape[:-1], 1000) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("strategy", strategies_here())
def test_takes_a_non_contiguous_input(strategy):
    weight, x = torch.randn(50, 16), torch.randn(16, 4).t()  # [4, 16], transposed storage
    out = apply_strategy(strategy, x, weight, None, pack(weight) if strategy == "onednn" else None)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_pack_refuses_anything_but_float32(dtype):
    with pytest.raises(ValueError, match=f"float32 CPU weight, got {dtype}"):
        pack(torch.randn(8, 4, dtype=dtype))


def fake_clock(monkeypatch, seconds):
    """Each product advances a fake clock by seconds[strategy](rows)."""
    now, product = [0.0], module.apply_strategy

    def timed(strategy, x, *args):
        now[0] += seconds[strategy](x.shape[0])
        return product(strategy, x, *args)

    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(module, "apply_strategy", timed)


def test_the_probe_picks_the_fastest_strategy_at_each_row_count(monkeypatch):
    monkeypatch.setattr(module, "onednn_available", lambda: True)
    fake_clock(monkeypatch, {"default": lambda rows: 2,
                             "weight-major": lambda rows: 1 if 1 < rows <= 4 else 3,
                             "onednn": lambda rows: 1.5 if rows in (1, 8) else 2})  # 2 at rows 2..6: a tie
    plan = fastest_strategies([torch.randn(8, 4)], (64, 1, 2, 4, 6, 8))  # any order
    assert plan == {1: "onednn", 2: "weight-major", 4: "weight-major", 6: "default", 8: "onednn", 64: "default"}


def test_without_onednn_the_probe_never_picks_it(monkeypatch):
    monkeypatch.setattr(module, "onednn_available", lambda: False)
    fake_clock(monkeypatch, {"default": lambda rows: 2, "weight-major": lambda rows: 3,
                             "onednn": lambda rows: pytest.fail("oneDNN timed without oneDNN")})
    assert fastest_strategies([torch.randn(8, 4)], (1, 2)) == {1: "default", 2: "default"}


def test_the_probe_times_weights_until_they_stream_from_memory(monkeypatch):
    timed = []
    monkeypatch.setattr(module, "PROBE_BYTES", 3 * 8 * 4 * 4)  # three [8, 4] float32 weights
    monkeypatch.setattr(module, "apply_strategy", lambda strategy, x, weight, *args: timed.append(weight.data_ptr()))
    weights = [torch.randn(8, 4) for _ in range(5)]
    fastest_strategies(weights, (1,), repeats=1)
    assert set(timed) == {w.data_ptr() for w in weights[:3]}


def test_the_probe_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    fastest_strategies([torch.randn(8, 4, generator=torch.Generator().manual_seed(1))], (1, 2), repeats=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN CPU linear")
def test_onednn_is_offered_where_this_torch_has_it():
    assert available_strategies() == STRATEGIES
