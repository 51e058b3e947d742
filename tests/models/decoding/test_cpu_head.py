"""The oneDNN vocabulary head (models/decoding/cpu_head.py): chosen by measurement, same logits, lossless."""
import copy
import re

import pytest
import torch
from torch import nn

from dspark.kernels import onednn_linear
from dspark.models.decoding import cpu_head
from dspark.models.decoding.cpu_head import OneDnnHead, fastest_head, head_backend
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.loading import with_lm_head
from dspark.models.errors import ConfigError
from tests.models.decoding.conftest import KINDS

pytestmark = pytest.mark.skipif(not onednn_linear.available(), reason="this torch has no oneDNN CPU linear")


@pytest.fixture
def onednn_wins(monkeypatch):
    monkeypatch.setattr(cpu_head, "onednn_wins_up_to", lambda weight, rows: max(rows))


def test_swaps_only_when_onednn_measures_faster(monkeypatch):
    linear = nn.Linear(16, 40, bias=False)
    monkeypatch.setattr(cpu_head, "onednn_wins_up_to", lambda weight, rows: 0)
    assert fastest_head(linear, (1, 8)) is linear
    monkeypatch.setattr(cpu_head, "onednn_wins_up_to", lambda weight, rows: 8)
    head = fastest_head(linear, (1, 8, 64))
    assert isinstance(head, OneDnnHead) and head.max_rows == 8


def test_calls_beyond_the_rows_onednn_won_take_the_default_path(monkeypatch):
    calls, kernel = [], onednn_linear.onednn_linear
    monkeypatch.setattr(cpu_head, "onednn_linear", lambda x, *args: calls.append(x.shape) or kernel(x, *args))
    linear = nn.Linear(16, 40)
    head = OneDnnHead(linear, max_rows=8)
    for shape in [(1, 16), (2, 4, 16), (3, 3, 16), (9, 16)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(head(x), linear(x), rtol=1e-5, atol=1e-5)
    assert calls == [(1, 16), (2, 4, 16)]  # 9 rows each for the last two


def test_an_unknown_lm_head_choice_is_one_clear_error():
    with pytest.raises(ConfigError, match=re.escape("lm_head must be one of auto|default, got 'mkl'")):
        with_lm_head(nn.Module(), "mkl", (1,))


def test_default_keeps_pytorchs_head(onednn_wins):
    model = nn.Module()
    model.lm_head = linear = nn.Linear(16, 40)
    assert with_lm_head(model, "default", (1,)).lm_head is linear
    assert isinstance(with_lm_head(model, "auto", (1,)).lm_head, OneDnnHead)


@pytest.mark.parametrize("head", [nn.Linear(16, 40).to(torch.bfloat16), nn.Embedding(40, 16)])
def test_leaves_other_heads_alone(head, onednn_wins):
    assert fastest_head(head, (1,)) is head


def test_keeps_the_linear_parameter_and_its_logits(onednn_wins):
    linear = nn.Linear(16, 40)
    head = fastest_head(linear, (1,))
    assert head.weight is linear.weight and head.bias is linear.bias
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(head(x), linear(x), rtol=1e-5, atol=1e-5)
    assert "lm_head.packed" not in dict(nn.ModuleDict({"lm_head": head}).state_dict())


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_stays_exact_with_onednn_heads(kind, embedded_target, embedded_drafters, prompts, onednn_wins):
    """Target and drafter both on the oneDNN head: speculative greedy equals plain greedy through that target."""
    target, drafter = copy.deepcopy(embedded_target), copy.deepcopy(embedded_drafters[kind])
    target.lm_head = fastest_head(target.lm_head, (1,))
    drafter.lm_head = fastest_head(drafter.lm_head, (1,))
    assert head_backend(target) == head_backend(drafter) == "oneDNN" and head_backend(embedded_target) == "default"
    config = GenerationConfig(max_new_tokens=16)
    plain = SpeculativeDecoder(target).generate(prompts, config)
    speculative = SpeculativeDecoder(target, drafter).generate(prompts, config)
    assert [g.token_ids for g in speculative] == [g.token_ids for g in plain]
    assert sum(r.accepted for g in speculative for r in g.rounds) > 0
