"""Eagle3: TTT training shapes, training == drafting for the same chain, and scratch rollback between rounds."""
import torch

from tests.models.drafters.drafter_helpers import GAMMA, make_drafter, target_sequence

VOCAB = 64


def propose(drafter, state, features, ids, start, stop, anchor_pos):
    bs = ids.shape[0]
    return drafter.propose(state, context_hidden=features[:, start:stop], context_tokens=ids[:, start:stop],
                           context_lengths=torch.full((bs,), stop - start), anchor=ids[:, anchor_pos])


def test_forward_train_shape_and_padding_stays_finite(tiny_target):
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=2, seq=10)
    mask = torch.ones(2, 10)
    mask[0, :3] = 0  # left padding
    mask[1, 7:] = 0  # right padding
    logits = drafter.forward_train(features, ids, mask, ttt_steps=3)
    assert logits.shape == (3, 2, 10, VOCAB)
    assert torch.isfinite(logits).all()


def test_ttt_steps_equal_the_drafted_chain(tiny_target):
    """Step k at position p-1 of forward_train sees what the k-th chain step of propose sees."""
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=2, seq=14)
    p = 6
    block = propose(drafter, drafter.init_state(2), features, ids, 0, p, p)
    drafted = ids.clone()
    drafted[:, p + 1:p + 1 + GAMMA] = block.tokens
    logits = drafter.forward_train(features, drafted, torch.ones(2, 14), ttt_steps=GAMMA)
    torch.testing.assert_close(logits[:, :, p - 1].transpose(0, 1), block.logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(block.tokens, block.logits.argmax(-1))
    assert block.confidence() is None


def test_later_steps_do_not_see_later_positions(tiny_target):
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=1, seq=12)
    base = drafter.forward_train(features, ids, torch.ones(1, 12), ttt_steps=3)
    changed = features.clone()
    changed[:, 6:] += 1.0
    logits = drafter.forward_train(changed, ids, torch.ones(1, 12), ttt_steps=3)
    assert torch.equal(logits[:, :, :6], base[:, :, :6])
    assert not torch.allclose(logits[:, :, 6], base[:, :, 6])


def test_scratch_chain_is_rolled_back_and_rounds_compose(tiny_target):
    """Round 1 (context 0..4) then round 2 (commit 5..8) drafts like one round with context 0..8."""
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=2, seq=14)
    state = drafter.init_state(2)
    propose(drafter, state, features, ids, 0, 5, 5)
    assert state.cache.lengths.tolist() == [5 + GAMMA - 1] * 2  # committed pairs plus the scratch chain
    two_rounds = propose(drafter, state, features, ids, 5, 9, 9)
    one_round = propose(drafter, drafter.init_state(2), features, ids, 0, 9, 9)
    assert state.committed.tolist() == [9, 9]
    assert torch.equal(two_rounds.tokens, one_round.tokens)
    torch.testing.assert_close(two_rounds.logits, one_round.logits, atol=1e-5, rtol=1e-5)


def test_ragged_batch_matches_single_requests(tiny_target):
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=2, seq=12)
    block = drafter.propose(drafter.init_state(2), context_hidden=features[:, :7], context_tokens=ids[:, :7],
                            context_lengths=torch.tensor([7, 4]), anchor=torch.stack([ids[0, 7], ids[1, 4]]))
    for row, p in ((0, 7), (1, 4)):
        alone = propose(drafter, drafter.init_state(1), features[row:row + 1], ids[row:row + 1], 0, p, p)
        torch.testing.assert_close(block.logits[row], alone.logits[0], atol=1e-5, rtol=1e-5)


def test_scored_positions_get_the_same_logits_and_gradients(tiny_target):
    """Computing logits only where the loss reads them changes neither the loss nor its gradient."""
    from dspark.models.training.losses import eagle3_loss, eagle3_valid_mask
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=2, seq=10)
    loss_mask = torch.zeros(2, 10, dtype=torch.bool)
    loss_mask[0, 4:], loss_mask[1, 2:8] = True, True
    target_logits = torch.randn(2, 10, VOCAB)
    scored = eagle3_valid_mask(loss_mask, 3)
    results = []
    for subset in (None, scored):
        drafter.zero_grad()
        logits = drafter.forward_train(features, ids, torch.ones(2, 10), ttt_steps=3, scored=subset)
        rows = [step[mask] for step, mask in zip(logits, scored)] if subset is None else logits
        loss = eagle3_loss(rows, target_logits, loss_mask).total
        loss.backward()
        results.append((logits, loss, drafter.fc.weight.grad.clone()))
    (full, loss_full, grad_full), (part, loss_part, grad_part) = results
    assert [step.shape[0] for step in part] == scored.flatten(1).sum(1).tolist()
    assert all(torch.allclose(p, f[m], atol=1e-6) for p, f, m in zip(part, full, scored))
    assert torch.allclose(loss_part, loss_full, atol=1e-6) and torch.allclose(grad_part, grad_full, atol=1e-6)


def test_draft_vocabulary_logits_are_those_columns_of_the_full_ones(tiny_target):
    drafter = make_drafter(tiny_target, "eagle3")
    ids, features = target_sequence(tiny_target, bs=2, seq=10)
    vocab_ids = torch.tensor([1, 5, 6, 20, 33, 63])
    with torch.no_grad():
        full = drafter.forward_train(features, ids, torch.ones(2, 10), ttt_steps=3)
        restricted = drafter.forward_train(features, ids, torch.ones(2, 10), ttt_steps=3, vocab_ids=vocab_ids)
    assert restricted.shape == (3, 2, 10, len(vocab_ids))
    torch.testing.assert_close(restricted, full[..., vocab_ids], atol=1e-5, rtol=1e-5)
