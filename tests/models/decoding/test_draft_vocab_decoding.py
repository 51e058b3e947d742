"""Drafting over a draft vocabulary (models/drafters/draft_vocab.py) keeps decoding exact: greedy output equals the
target's, and T=1 samples follow the target's distribution, also for tokens the drafter can never propose."""
import copy
import re
import shutil

import pytest
import torch
from torch import nn

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding import cpu_linears
from dspark.models.decoding.cpu_linears import ProbedLinear
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.decoding.loading import load_drafter_for, load_target
from dspark.models.drafters.draft_vocab import DRAFT_VOCAB_FILE, most_frequent, save_draft_vocab
from dspark.models.errors import CheckpointError, ConfigError
from tests.models.decoding.conftest import KINDS
from tests.paths import EMBEDDED, EMBEDDED_TARGET
from tests.models.decoding.test_engine_sampling import (P_MIN, same_distribution_pvalue, speculative_samples,
                                                         target_samples)

MAX_NEW = 24


def recording_proposals(drafter):
    """The drafter, recording every block it proposes."""
    blocks, propose = [], drafter.propose
    drafter.propose = lambda *args, **kwargs: blocks.append(propose(*args, **kwargs)) or blocks[-1]
    return blocks


@pytest.fixture(scope="module")
def greedy_references(embedded_target, prompts):
    return [g.token_ids for g in SpeculativeDecoder(embedded_target).generate(prompts, GenerationConfig(MAX_NEW))]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_output_stays_exact_and_drafts_stay_inside(kind, embedded_target, embedded_drafters, prompts,
                                                          greedy_references):
    drafter = copy.deepcopy(embedded_drafters[kind])
    # the tokens of the target's own replies, less the rarer half: some of its tokens can never be drafted
    replies = torch.tensor([t for reply in greedy_references for t in reply])
    ids, coverage = most_frequent(replies, drafter.config.vocab_size, size=len(replies.unique()) // 2)
    assert coverage < 1.0
    drafter.restrict_vocabulary(ids)
    blocks = recording_proposals(drafter)
    outputs = SpeculativeDecoder(embedded_target, drafter).generate(prompts, GenerationConfig(MAX_NEW))
    assert [g.token_ids for g in outputs] == greedy_references
    assert sum(r.accepted for g in outputs for r in g.rounds) > 0
    drafted = torch.cat([b.tokens.flatten() for b in blocks])
    assert torch.isin(drafted, ids).all() and blocks[0].logits.shape[-1] == len(ids)


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_sampling_matches_the_target_with_tokens_the_drafter_cannot_propose(kind, embedded_target,
                                                                            embedded_drafters, prompts):
    params, prompt = SamplingParams(1.0), prompts[1]
    reference = target_samples(embedded_target, prompt, params, seed=1)
    drafter = copy.deepcopy(embedded_drafters[kind])
    ids, coverage = most_frequent(reference, drafter.config.vocab_size, size=len(reference.unique()) // 4)
    assert 0.3 < coverage < 0.95  # the excluded tokens are sampled often enough to show up in the test
    drafter.restrict_vocabulary(ids)
    speculative, outputs = speculative_samples(embedded_target, drafter, prompt, params, seed=2,
                                               policy=VerifyLengthPolicy.of("fixed"))
    assert sum(r.accepted for g in outputs for r in g.rounds) > len(outputs) // 10, "drafts must be accepted often"
    assert not torch.isin(speculative, ids).all(), "tokens outside the draft vocabulary must still be emitted"
    for position in range(reference.shape[1]):
        assert same_distribution_pvalue(reference[:, position], speculative[:, position]) > P_MIN, position


def test_loading_drafts_over_the_vocabulary_beside_the_drafter_unless_told_full(tmp_path):
    drafter_dir = tmp_path / "dspark"
    shutil.copytree(EMBEDDED / "dspark", drafter_dir)
    target = load_target(EMBEDDED_TARGET, cpu_linears="default")
    assert load_drafter_for(drafter_dir, target).draft_vocab is None  # no draft_vocab.json
    save_draft_vocab(drafter_dir, torch.tensor([3, 7, 11]), "a test", counted_tokens=3, coverage=1.0)
    assert load_drafter_for(drafter_dir, target).draft_vocab.token_ids.tolist() == [3, 7, 11]
    assert load_drafter_for(drafter_dir, target, draft_vocab="full").draft_vocab is None
    with pytest.raises(ConfigError, match=re.escape("draft_vocab must be one of auto|full, got 'some'")):
        load_drafter_for(drafter_dir, target, draft_vocab="some")
    (drafter_dir / DRAFT_VOCAB_FILE).write_text('{"token_ids": [7, 3]}')
    with pytest.raises(CheckpointError, match="must be sorted, distinct"):
        load_drafter_for(drafter_dir, target)


def test_the_heads_a_draft_vocabulary_replaces_are_not_probed(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_linears, "fastest_strategies", lambda weights, rows: {r: "weight-major" for r in rows})
    drafter_dir = tmp_path / "dspark"
    shutil.copytree(EMBEDDED / "dspark", drafter_dir)
    target = load_target(EMBEDDED_TARGET, cpu_linears="default")
    full = load_drafter_for(drafter_dir, target, "float32", cpu_linears="auto")
    assert isinstance(full.lm_head, ProbedLinear) and isinstance(full.markov_head.markov_w2, ProbedLinear)
    save_draft_vocab(drafter_dir, torch.tensor([3, 7, 11]), "a test", counted_tokens=3, coverage=1.0)
    restricted = load_drafter_for(drafter_dir, target, "float32", cpu_linears="auto")
    assert type(restricted.lm_head) is nn.Linear and type(restricted.markov_head.markov_w2) is nn.Linear
    assert isinstance(restricted.draft_vocab.head, ProbedLinear)
    assert any(isinstance(module, ProbedLinear) for module in restricted.layers.modules())
