"""Markov heads (vanilla / gated / rnn) and the confidence head, against their formulas (docs/training.md)."""
import pytest
import torch

from dspark.kernels.warping import SamplingParams
from dspark.models.drafters.confidence_head import ConfidenceHead
from dspark.models.drafters.markov_head import build_markov_head
from tests.models.drafters.drafter_helpers import make_drafter, target_sequence

VOCAB, RANK, HIDDEN, GAMMA, BS = 50, 6, 12, 5, 3


def random_head(head_type: str):
    torch.manual_seed(0)
    head = build_markov_head(head_type, VOCAB, RANK, HIDDEN)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.5)
    return head


def block_inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(BS, GAMMA, VOCAB, generator=g)
    hidden = torch.randn(BS, GAMMA, HIDDEN, generator=g)
    prev = torch.randint(0, VOCAB, (BS, GAMMA), generator=g)
    return base, hidden, prev


def formula_logits(head_type, head, base, hidden, prev):
    """The reference formulas written out position by position."""
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    state = torch.zeros(BS, RANK)
    out = []
    for k in range(GAMMA):
        e = w1[prev[:, k]]
        if head_type == "vanilla":
            latent = e
        elif head_type == "gated":
            latent = torch.sigmoid(torch.cat([hidden[:, k], e], -1) @ head.gate_proj.weight.T + head.gate_proj.bias) * e
        else:
            z = torch.cat([state, e, hidden[:, k]], -1) @ head.joint_proj.weight.T + head.joint_proj.bias
            g, c, o = z[:, :RANK], z[:, RANK:2 * RANK], z[:, 2 * RANK:]
            state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(c)
            latent = torch.tanh(o)
        out.append(base[:, k] + latent @ w2.T)
    return torch.stack(out, 1)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_block_logits_follow_the_reference_formula(head_type):
    head = random_head(head_type)
    base, hidden, prev = block_inputs()
    with torch.no_grad():
        torch.testing.assert_close(head.block_logits(base, hidden, prev),
                                   formula_logits(head_type, head, base, hidden, prev), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_teacher_forced_block_equals_sequential_sampling(head_type, temperature):
    """Feeding the sampled tokens back as teacher-forced prev tokens reproduces the sampled step logits."""
    head = random_head(head_type)
    base, hidden, _ = block_inputs()
    anchor = torch.tensor([3, 7, 11])
    with torch.no_grad():
        tokens, logits = head.sample_block(base, hidden, anchor, SamplingParams(temperature), torch.Generator().manual_seed(5))
        prev = torch.cat([anchor[:, None], tokens[:, :-1]], 1)
        torch.testing.assert_close(head.block_logits(base, hidden, prev), logits, atol=1e-6, rtol=1e-6)
    if temperature == 0.0:
        assert torch.equal(tokens, logits.argmax(-1))


def test_only_the_rnn_head_carries_state_across_positions():
    base, hidden, prev = block_inputs()
    changed = prev.clone()
    changed[:, 0] = (prev[:, 0] + 1) % VOCAB
    for head_type, carries in (("vanilla", False), ("gated", False), ("rnn", True)):
        head = random_head(head_type)
        with torch.no_grad():
            a, b = head.block_logits(base, hidden, prev), head.block_logits(base, hidden, changed)
        assert not torch.allclose(a[:, 0], b[:, 0])
        assert torch.allclose(a[:, 2:], b[:, 2:]) != carries


@pytest.mark.parametrize("with_markov", [True, False])
def test_confidence_head_reads_hidden_and_markov_embedding(with_markov):
    torch.manual_seed(0)
    head = ConfidenceHead(HIDDEN, RANK, with_markov)
    hidden, prev_emb = torch.randn(BS, GAMMA, HIDDEN), torch.randn(BS, GAMMA, RANK)
    features = torch.cat([hidden, prev_emb], -1) if with_markov else hidden
    expected = features @ head.proj.weight[0] + head.proj.bias[0]
    with torch.no_grad():
        torch.testing.assert_close(head(hidden, prev_emb), expected, atol=1e-6, rtol=1e-6)
    assert head.proj.in_features == HIDDEN + (RANK if with_markov else 0)


def test_confidence_prev_token_is_the_anchor_then_the_previous_draft(tiny_target):
    """Changing W1 of the anchor moves only slot 0's confidence; W1 of x_{p+1} moves only slot 1's."""
    drafter = make_drafter(tiny_target, "dspark_vanilla")
    ids, features = target_sequence(tiny_target, bs=1, seq=12)
    p = 4
    ids[0, p:p + 3] = torch.tensor([10, 20, 30])  # anchor, x_{p+1}, x_{p+2}: distinct tokens
    anchors, keep = torch.tensor([[p]]), torch.ones(1, 1, dtype=torch.bool)
    with torch.no_grad():
        base = drafter.forward_train(features, ids, anchors, keep).confidence_logits[0, 0]
        for token, slot in ((10, 0), (20, 1)):
            saved = drafter.markov_head.markov_w1.weight[token].clone()
            drafter.markov_head.markov_w1.weight[token] += 1.0
            moved = drafter.forward_train(features, ids, anchors, keep).confidence_logits[0, 0] != base
            drafter.markov_head.markov_w1.weight[token] = saved
            assert moved.tolist() == [k == slot for k in range(moved.shape[0])]
