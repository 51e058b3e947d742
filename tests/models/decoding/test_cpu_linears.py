"""Probed CPU linears (models/decoding/cpu_linears.py): chosen by measurement, same outputs, lossless decoding."""
import copy
import re

import pytest
import torch
from torch import nn

from dspark.models.decoding import cpu_linears
from dspark.models.decoding.cpu_linears import ProbedLinear, describe, linear_plans, with_fastest_linears
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.loading import probed_rows, with_cpu_linears
from dspark.kernels.cpu_linear import available_strategies
from dspark.models.errors import ConfigError
from tests.models.decoding.conftest import KINDS

FASTEST = "onednn" if "onednn" in available_strategies() else "weight-major"


def prefer(monkeypatch, strategy_at):
    """The probe made to report strategy_at(rows) for every shape, as some CPU would measure it."""
    monkeypatch.setattr(cpu_linears, "fastest_strategies",
                        lambda weights, rows: {r: strategy_at(r) for r in rows})


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 40), nn.Linear(40, 16, bias=False)
        self.norm = nn.LayerNorm(16)


def test_swaps_every_linear_of_a_group_where_another_strategy_wins(monkeypatch):
    model = nn.Sequential(Block(), Block())
    prefer(monkeypatch, lambda rows: "weight-major" if rows <= 2 else "default")
    with_fastest_linears(model, (1, 2, 8))
    assert all(isinstance(block.up, ProbedLinear) and isinstance(block.down, ProbedLinear) for block in model)
    assert isinstance(model[0].norm, nn.LayerNorm)
    assert linear_plans(model) == {"16x40 (2)": "1-2:weight-major 3-8:default",
                                   "40x16 (2)": "1-2:weight-major 3-8:default"}


def test_skipped_linears_are_neither_timed_nor_swapped(monkeypatch):
    timed = []
    monkeypatch.setattr(cpu_linears, "fastest_strategies",
                        lambda weights, rows: timed.extend(weights) or {r: "weight-major" for r in rows})
    model = nn.Sequential(Block(), Block())
    with_fastest_linears(model, (1, 2), skip=[model[1].up])
    assert type(model[1].up) is nn.Linear and isinstance(model[0].up, ProbedLinear)
    assert all(weight is not model[1].up.weight for weight in timed)
    assert linear_plans(model) == {"16x40 (2)": "1-2:weight-major", "40x16 (1)": "1-2:weight-major"}


def test_keeps_pytorchs_linear_where_it_wins_everywhere(monkeypatch):
    model = Block()
    prefer(monkeypatch, lambda rows: "default")
    with_fastest_linears(model, (1, 8))
    assert type(model.up) is nn.Linear and linear_plans(model) == {}


def test_a_call_takes_the_strategy_of_the_next_probed_count_and_the_default_beyond(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_linears, "apply_strategy",
                        lambda strategy, x, *args: calls.append((x.numel() // x.shape[-1], strategy)))
    linear = ProbedLinear(nn.Linear(16, 40), {1: "weight-major", 4: FASTEST, 16: "weight-major"})
    for rows in (1, 2, 4, 5, 16, 17):
        linear(torch.randn(rows, 16))
    linear(torch.randn(2, 3, 16))  # 6 rows
    assert calls == [(1, "weight-major"), (2, FASTEST), (4, FASTEST), (5, "weight-major"),
                     (16, "weight-major"), (17, "default"), (6, "weight-major")]


@pytest.mark.parametrize("strategy", available_strategies())
def test_keeps_the_linear_parameters_and_its_outputs(strategy):
    linear = nn.Linear(16, 40)
    probed = ProbedLinear(linear, {8: strategy})
    assert probed.weight is linear.weight and probed.bias is linear.bias
    for shape in [(1, 16), (2, 3, 16), (9, 16)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(probed(x), linear(x), rtol=1e-5, atol=1e-5)
    assert set(nn.ModuleDict({"head": probed}).state_dict()) == {"head.weight", "head.bias"}


def test_a_tied_head_stays_tied_and_is_probed_once(monkeypatch):
    probed_groups = []
    monkeypatch.setattr(cpu_linears, "fastest_strategies",
                        lambda weights, rows: probed_groups.append(len(weights)) or {1: "weight-major"})
    model = nn.Module()
    model.embed = nn.Embedding(40, 16)
    model.lm_head = model.also_head = nn.Linear(16, 40, bias=False)
    model.lm_head.weight = model.embed.weight
    with_fastest_linears(model, (1,))
    assert model.lm_head is model.also_head and model.lm_head.weight is model.embed.weight
    assert probed_groups == [1]


@pytest.mark.parametrize("layer", [nn.Linear(16, 40).to(torch.bfloat16), nn.Embedding(40, 16)])
def test_leaves_other_layers_alone(layer, monkeypatch):
    prefer(monkeypatch, lambda rows: "weight-major")
    model = nn.Sequential(layer)
    assert with_fastest_linears(model, (1,))[0] is layer


def test_default_keeps_pytorchs_linears_and_a_bad_choice_is_one_clear_error(monkeypatch):
    prefer(monkeypatch, lambda rows: "weight-major")
    assert type(with_cpu_linears(Block(), "default", (1,)).up) is nn.Linear
    assert isinstance(with_cpu_linears(Block(), "auto", (1,)).up, ProbedLinear)
    with pytest.raises(ConfigError, match=re.escape("cpu_linears must be one of auto|default, got 'mkl'")):
        with_cpu_linears(Block(), "mkl", (1,))


def test_probed_rows_cover_a_block():
    assert probed_rows() == (1, 2, 3, 4, 5, 6, 7, 8) and probed_rows(11) == tuple(range(1, 12))


def test_describe_names_runs_of_rows():
    assert describe(["default", "onednn", "weight-major", "weight-major", "default"]) == \
        "1:onednn 2-3:weight-major 4:default"


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_stays_exact_with_probed_linears(kind, embedded_target, embedded_drafters, prompts,
                                                         monkeypatch):
    """Every linear of target and drafter off PyTorch's path (a different strategy by row count): speculative
    greedy equals plain greedy through that target."""
    prefer(monkeypatch, lambda rows: ("weight-major", FASTEST)[rows % 2])
    target, drafter = copy.deepcopy(embedded_target), copy.deepcopy(embedded_drafters[kind])
    with_fastest_linears(target, probed_rows())
    with_fastest_linears(drafter, probed_rows(drafter.config.gamma + 1))
    assert not any(type(m) is nn.Linear for m in [*target.modules(), *drafter.modules()])
    config = GenerationConfig(max_new_tokens=16)
    plain = SpeculativeDecoder(target).generate(prompts, config)
    speculative = SpeculativeDecoder(target, drafter).generate(prompts, config)
    assert [g.token_ids for g in speculative] == [g.token_ids for g in plain]
    assert sum(r.accepted for g in speculative for r in g.rounds) > 0
