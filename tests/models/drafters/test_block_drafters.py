"""DSpark / DFlash: output shapes, the training mask, and training == drafting for the same tokens."""
import pytest
import torch

from dspark.kernels.warping import SamplingParams
from tests.models.drafters.drafter_helpers import BLOCK_VARIANTS, GAMMA, make_drafter, target_sequence

VOCAB = 64


def propose_once(drafter, ids, features, anchor_pos, temperature=0.0, generator=None):
    """One round with context 0..anchor_pos-1 for every row of the batch."""
    bs = ids.shape[0]
    state = drafter.init_state(bs)
    block = drafter.propose(state, context_hidden=features[:, :anchor_pos], context_tokens=ids[:, :anchor_pos],
                            context_lengths=torch.full((bs,), anchor_pos), anchor=ids[:, anchor_pos],
                            sampling=SamplingParams(temperature), generator=generator)
    return state, block


@pytest.mark.parametrize("variant", BLOCK_VARIANTS)
def test_forward_train_shapes_and_finite_with_dropped_blocks(tiny_target, variant):
    drafter = make_drafter(tiny_target, variant)
    ids, features = target_sequence(tiny_target, bs=2, seq=12)
    anchors = torch.tensor([[0, 4, 10], [2, 3, 0]])
    keep = torch.tensor([[True, True, True], [True, True, False]])
    out = drafter.forward_train(features, ids, anchors, keep)
    assert out.draft_logits.shape == (2, 3, GAMMA, VOCAB)
    assert torch.isfinite(out.draft_logits).all()
    if drafter.confidence_head is None:
        assert out.confidence_logits is None
    else:
        assert out.confidence_logits.shape == (2, 3, GAMMA)
        assert torch.isfinite(out.confidence_logits).all()


@pytest.mark.parametrize("variant", BLOCK_VARIANTS)
def test_training_over_a_draft_vocabulary_computes_only_its_columns(tiny_target, variant):
    """Restricted to V', the teacher-forced logits (base + Markov bias, every head type) are the full logits'
    V' columns, and the confidence is unchanged."""
    drafter = make_drafter(tiny_target, variant)
    ids, features = target_sequence(tiny_target, bs=2, seq=12)
    anchors, keep = torch.tensor([[0, 4, 7], [2, 3, 6]]), torch.ones(2, 3, dtype=torch.bool)
    vocab_ids = torch.tensor([1, 5, 6, 20, 33, 63])
    with torch.no_grad():
        full = drafter.forward_train(features, ids, anchors, keep)
        restricted = drafter.forward_train(features, ids, anchors, keep, vocab_ids)
    assert restricted.draft_logits.shape == (2, 3, GAMMA, len(vocab_ids))
    torch.testing.assert_close(restricted.draft_logits, full.draft_logits[..., vocab_ids], atol=1e-5, rtol=1e-5)
    if full.confidence_logits is not None:
        torch.testing.assert_close(restricted.confidence_logits, full.confidence_logits)


@pytest.mark.parametrize("variant", BLOCK_VARIANTS)
def test_propose_shapes(tiny_target, variant):
    drafter = make_drafter(tiny_target, variant)
    ids, features = target_sequence(tiny_target, bs=3, seq=12)
    state, block = propose_once(drafter, ids, features, anchor_pos=7, temperature=1.0,
                                generator=torch.Generator().manual_seed(0))
    assert block.tokens.shape == (3, GAMMA) and block.tokens.dtype == torch.long
    assert block.logits.shape == (3, GAMMA, VOCAB)
    assert torch.allclose(block.probs().sum(-1), torch.ones(3, GAMMA))
    assert state.committed.tolist() == [7, 7, 7]
    if drafter.confidence_head is None:
        assert block.confidence() is None
    else:
        confidence = block.confidence()
        assert confidence.shape == (3, GAMMA)
        assert ((confidence > 0) & (confidence < 1)).all()


@pytest.mark.parametrize("variant", BLOCK_VARIANTS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_teacher_forced_training_equals_drafting(tiny_target, variant, temperature):
    """forward_train on [context, anchor, drafted tokens] reproduces propose's logits and confidence."""
    drafter = make_drafter(tiny_target, variant)
    ids, features = target_sequence(tiny_target, bs=2, seq=14)
    p = 6
    _, block = propose_once(drafter, ids, features, p, temperature, torch.Generator().manual_seed(3))
    drafted = ids.clone()
    drafted[:, p + 1:p + 1 + GAMMA] = block.tokens  # the "data" is now exactly what was drafted
    out = drafter.forward_train(features, drafted, torch.tensor([[p], [p]]), torch.ones(2, 1, dtype=torch.bool))
    torch.testing.assert_close(out.draft_logits[:, 0], block.logits, atol=1e-5, rtol=1e-5)
    if block.confidence_logits is not None:
        torch.testing.assert_close(torch.sigmoid(out.confidence_logits[:, 0]), block.confidence(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["dspark_vanilla", "dflash"])
def test_block_sees_context_strictly_before_its_anchor(tiny_target, variant):
    drafter = make_drafter(tiny_target, variant)
    ids, features = target_sequence(tiny_target, bs=1, seq=12)
    anchors, keep = torch.tensor([[5]]), torch.ones(1, 1, dtype=torch.bool)
    base = drafter.forward_train(features, ids, anchors, keep).draft_logits
    at_anchor = features.clone()
    at_anchor[:, 5:] += 1.0  # the anchor's own and later features
    before = features.clone()
    before[:, 4] += 1.0
    assert torch.equal(drafter.forward_train(at_anchor, ids, anchors, keep).draft_logits, base)
    assert not torch.allclose(drafter.forward_train(before, ids, anchors, keep).draft_logits, base)


def test_blocks_are_independent_of_each_other(tiny_target):
    drafter = make_drafter(tiny_target, "dspark_gated")
    ids, features = target_sequence(tiny_target, bs=1, seq=14)
    together = drafter.forward_train(features, ids, torch.tensor([[3, 8, 5]]), torch.tensor([[True, True, False]]))
    alone = drafter.forward_train(features, ids, torch.tensor([[8]]), torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(together.draft_logits[:, 1], alone.draft_logits[:, 0], atol=1e-5, rtol=1e-5)


def test_ragged_batch_and_multi_round_match_single_requests(tiny_target):
    """Two requests with different lengths, fed over two rounds, draft as if each ran alone in one round."""
    drafter = make_drafter(tiny_target, "dspark_rnn")
    ids, features = target_sequence(tiny_target, bs=2, seq=14)
    state = drafter.init_state(2)
    drafter.propose(state, context_hidden=features[:, :5], context_tokens=ids[:, :5],
                    context_lengths=torch.tensor([5, 3]), anchor=torch.stack([ids[0, 5], ids[1, 3]]))
    # round 2: request 0 commits positions 5..7, request 1 commits 3..8 (rows are right-padded)
    new_hidden = torch.stack([torch.cat([features[0, 5:8], features[0, :3]]), features[1, 3:9]])
    new_tokens = torch.stack([torch.cat([ids[0, 5:8], ids[0, :3]]), ids[1, 3:9]])
    block = drafter.propose(state, context_hidden=new_hidden, context_tokens=new_tokens,
                            context_lengths=torch.tensor([3, 6]), anchor=torch.stack([ids[0, 8], ids[1, 9]]))
    assert state.committed.tolist() == [8, 9]
    for row, p in ((0, 8), (1, 9)):
        _, alone = propose_once(drafter, ids[row:row + 1], features[row:row + 1], p)
        assert torch.equal(block.tokens[row], alone.tokens[0])
        torch.testing.assert_close(block.logits[row], alone.logits[0], atol=1e-5, rtol=1e-5)


def test_select_drops_a_request(tiny_target):
    drafter = make_drafter(tiny_target, "dflash")
    ids, features = target_sequence(tiny_target, bs=2, seq=12)
    state = drafter.init_state(2)
    drafter.propose(state, context_hidden=features[:, :6], context_tokens=ids[:, :6],
                    context_lengths=torch.tensor([6, 4]), anchor=torch.stack([ids[0, 6], ids[1, 4]]))
    state.select(torch.tensor([1]))
    block = drafter.propose(state, context_hidden=features[1:, 4:6], context_tokens=ids[1:, 4:6],
                            context_lengths=torch.tensor([2]), anchor=ids[1:, 6])
    _, alone = propose_once(drafter, ids[1:], features[1:], 6)
    torch.testing.assert_close(block.logits, alone.logits, atol=1e-5, rtol=1e-5)


def test_greedy_drafting_is_argmax_of_the_corrected_logits(tiny_target):
    drafter = make_drafter(tiny_target, "dspark_vanilla")
    ids, features = target_sequence(tiny_target, bs=2, seq=12)
    _, block = propose_once(drafter, ids, features, 5)
    assert torch.equal(block.tokens, block.logits.argmax(-1))
    assert torch.equal(block.probs().argmax(-1), block.tokens) and torch.equal(block.probs().sum(-1), torch.ones(2, GAMMA))


def test_propose_rejects_bad_lengths(tiny_target):
    drafter = make_drafter(tiny_target, "dflash")
    ids, features = target_sequence(tiny_target, bs=2, seq=8)
    with pytest.raises(ValueError, match="context_lengths"):
        drafter.propose(drafter.init_state(2), context_hidden=features, context_tokens=ids,
                        context_lengths=torch.tensor([0, 3]), anchor=ids[:, 0])
