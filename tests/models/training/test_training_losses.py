"""Loss terms on small hand-computed cases (reference §2.4, §4; paper Eq. 8-12)."""
import math

import pytest
import torch

from dspark.models.errors import ConfigError
from dspark.models.training.losses import (
    DFLASH_GREEDY_LOSS,
    DFLASH_LOSS,
    DSPARK_GREEDY_LOSS,
    DSPARK_LOSS,
    BlockLossWeights,
    block_loss,
    eagle3_loss,
    eagle3_target_positions,
    eagle3_valid_mask,
    position_weights,
)

LN3 = math.log(3.0)
W1 = math.exp(-0.25)  # weight of slot k=1 with decay 4


def _two_slot_case():
    """One block, gamma 3, vocab 2; slot 2 is unsupervised and full of garbage.

    slot 0: p_d = [.5, .5],  p_t = [.75, .25], label 0 -> CE ln 2,     L1 0.5, c* 0.75
    slot 1: p_d = [.75,.25], p_t = [.75, .25], label 0 -> CE ln(4/3),  L1 0,   c* 1
    """
    draft = torch.tensor([[[[0.0, 0.0], [LN3, 0.0], [50.0, -50.0]]]], requires_grad=True)
    target = torch.tensor([[[[LN3, 0.0], [LN3, 0.0], [-50.0, 50.0]]]])
    labels = torch.tensor([[[0, 0, 1]]])
    eval_mask = torch.tensor([[[True, True, False]]])
    conf = torch.tensor([[[LN3, 0.0, 9.0]]], requires_grad=True)  # sigma = 0.75, 0.5
    return draft, target, labels, eval_mask, conf


def test_position_weights_decay_and_mask():
    w = position_weights(torch.tensor([[[True, True, True, False]]]), decay=4.0)
    expected = torch.tensor([[[1.0, W1, math.exp(-0.5), 0.0]]])
    assert torch.allclose(w, expected)


def test_dspark_terms_hand_computed():
    draft, target, labels, eval_mask, conf = _two_slot_case()
    out = block_loss(draft, labels, eval_mask, DSPARK_LOSS, target_logits=target, confidence_logits=conf)
    norm = 1.0 + W1 + 1e-6
    ce = (math.log(2) + W1 * math.log(4 / 3)) / norm
    tv = (1.0 * 0.5 + W1 * 0.0) / norm
    bce0 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # sigma(ln3) = .75 vs c* = .75
    bce1 = math.log(2)  # sigma(0) = .5 vs c* = 1
    conf_l = (bce0 + W1 * bce1) / norm
    assert out.terms["ce"] == pytest.approx(ce, rel=1e-5)
    assert out.terms["tv"] == pytest.approx(tv, rel=1e-5)
    assert out.terms["conf"] == pytest.approx(conf_l, rel=1e-5)
    assert out.terms["accept"] == pytest.approx((1.0 * 0.75 + W1 * 1.0) / norm, rel=1e-5)
    assert out.total.item() == pytest.approx(0.1 * ce + 0.9 * tv + 1.0 * conf_l, rel=1e-5)


def test_weight_total_overrides_normaliser():
    draft, target, labels, eval_mask, conf = _two_slot_case()
    local = block_loss(draft, labels, eval_mask, DSPARK_LOSS, target, conf)
    global_ = block_loss(draft, labels, eval_mask, DSPARK_LOSS, target, conf, weight_total=torch.tensor(4 * (1 + W1)))
    assert global_.total.item() == pytest.approx(local.total.item() / 4, rel=1e-5)


def test_confidence_label_is_detached():
    draft, target, labels, eval_mask, conf = _two_slot_case()
    only_conf = BlockLossWeights(ce=0.0, tv=0.0, conf=1.0)
    block_loss(draft, labels, eval_mask, only_conf, target, conf).total.backward()
    assert draft.grad is None or torch.count_nonzero(draft.grad) == 0
    assert conf.grad[0, 0, 2] == 0 and abs(conf.grad[0, 0, 0]) < 1e-6  # sigma = c* exactly at slot 0
    assert conf.grad[0, 0, 1] < 0  # sigma 0.5 < c* = 1: pushed up


def test_unsupervised_slots_do_not_matter():
    draft, target, labels, eval_mask, conf = _two_slot_case()
    base = block_loss(draft, labels, eval_mask, DSPARK_LOSS, target, conf).total
    draft2, target2, conf2 = draft.detach().clone(), target.clone(), conf.detach().clone()
    draft2[..., 2, :] = torch.tensor([-7.0, 3.0])
    target2[..., 2, :] = 0.0
    conf2[..., 2] = -4.0
    assert block_loss(draft2, labels, eval_mask, DSPARK_LOSS, target2, conf2).total.item() == pytest.approx(base.item())


def test_dflash_is_decayed_ce_only():
    draft, target, labels, eval_mask, _ = _two_slot_case()
    out = block_loss(draft, labels, eval_mask, DFLASH_LOSS)
    ce = (math.log(2) + W1 * math.log(4 / 3)) / (1 + W1 + 1e-6)
    assert out.total.item() == pytest.approx(ce, rel=1e-5)
    assert set(out.terms) == {"ce", "loss"}
    with_diag = block_loss(draft, labels, eval_mask, DFLASH_LOSS, target_logits=target)
    assert with_diag.total.item() == pytest.approx(ce, rel=1e-5) and "accept" in with_diag.terms


def test_empty_batch_gives_zero_not_nan():
    draft, target, labels, _, conf = _two_slot_case()
    out = block_loss(draft, labels, torch.zeros(1, 1, 3, dtype=torch.bool), DSPARK_LOSS, target, conf)
    assert out.total.item() == 0.0


def test_block_loss_requires_inputs_its_weights_need():
    draft, target, labels, eval_mask, _ = _two_slot_case()
    with pytest.raises(ValueError, match="target_logits"):
        block_loss(draft, labels, eval_mask, DSPARK_LOSS)
    with pytest.raises(ValueError, match="confidence_logits"):
        block_loss(draft, labels, eval_mask, DSPARK_LOSS, target_logits=target)


def test_loss_weights_validated():
    with pytest.raises(ConfigError, match="decay"):
        BlockLossWeights(decay=0.0)
    with pytest.raises(ConfigError, match="all 0"):
        BlockLossWeights(ce=0.0, tv=0.0, conf=0.0)


def scored_rows(step_logits: torch.Tensor, loss_mask: torch.Tensor) -> list[torch.Tensor]:
    """[ttt, bs, seq, vocab] logits at every position -> what eagle3_loss reads: step k at the valid_k positions."""
    valid = eagle3_valid_mask(loss_mask, step_logits.shape[0])
    return [step[mask] for step, mask in zip(step_logits, valid)]


def test_eagle3_valid_mask():
    valid = eagle3_valid_mask(torch.tensor([[0, 1, 1, 1]]), ttt_steps=2)
    assert valid.int().tolist() == [[[1, 1, 0, 0]], [[1, 0, 0, 0]]]


def test_eagle3_uniform_draft_hand_computed():
    # A uniform draft has soft-CE ln V against any target. Step 0 has 2 valid positions, step 1 one; norm = 2.
    vocab = 4
    step_logits = torch.zeros(2, 1, 4, vocab)
    target = torch.randn(1, 4, vocab)
    loss_mask = torch.tensor([[0, 1, 1, 1]])
    out = eagle3_loss(scored_rows(step_logits, loss_mask), target, loss_mask)
    ln_v = math.log(vocab)
    assert out.terms["step0"] == pytest.approx(ln_v, rel=1e-5)
    assert out.terms["step1"] == pytest.approx(ln_v / 2, rel=1e-5)
    assert out.total.item() == pytest.approx(ln_v + 0.8 * ln_v / 2, rel=1e-5)


def test_eagle3_matches_loop_reference():
    torch.manual_seed(0)
    ttt, bs, seq, vocab = 3, 2, 7, 5
    step_logits = torch.randn(ttt, bs, seq, vocab)
    target = torch.randn(bs, seq, vocab)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0]])
    expected, norm = 0.0, 0
    for b in range(bs):
        for t in range(seq):
            norm += int(t + 2 < seq and loss_mask[b, t + 1] and loss_mask[b, t + 2])
    for k in range(ttt):
        for b in range(bs):
            for t in range(seq):
                if t + k + 2 < seq and loss_mask[b, t + 1] and loss_mask[b, t + k + 2]:
                    p_t = torch.softmax(target[b, t + k + 1], -1)
                    ce = -(p_t * torch.log_softmax(step_logits[k, b, t], -1)).sum().item()
                    expected += 0.8**k * ce / norm
    out = eagle3_loss(scored_rows(step_logits, loss_mask), target, loss_mask)
    assert out.total.item() == pytest.approx(expected, rel=1e-4)


def test_eagle3_perfect_draft_accepts_everything():
    torch.manual_seed(1)
    target = torch.randn(1, 6, 5)
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    # Step k at position t imitates the target at t+k+1.
    step_logits = torch.stack([torch.roll(target, -(k + 1), dims=1) for k in range(2)])
    out = eagle3_loss(scored_rows(step_logits, loss_mask), target, loss_mask)
    assert out.terms["accept"] == pytest.approx(1.0, rel=1e-5)
    p = torch.softmax(target[0], -1)
    entropy = -(p * p.log()).sum(-1)  # soft-CE of a perfect draft = the target's entropy
    valid0 = entropy[1:5].sum()  # step 0: t = 0..3 imitates positions 1..4
    valid1 = entropy[2:5].sum()  # step 1: t = 0..2 imitates positions 2..4
    assert out.total.item() == pytest.approx(((valid0 + 0.8 * valid1) / 4).item(), rel=1e-5)


def test_a_draft_vocabulary_of_every_token_is_the_full_eagle3_loss():
    torch.manual_seed(2)
    step_logits, target = torch.randn(3, 2, 7, 6), torch.randn(2, 7, 6)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0]])
    full = eagle3_loss(scored_rows(step_logits, loss_mask), target, loss_mask)
    every = eagle3_loss(scored_rows(step_logits, loss_mask), target, loss_mask, vocab_ids=torch.arange(6))
    assert every.terms == pytest.approx(full.terms, rel=1e-6)


def test_the_eagle3_draft_vocabulary_loss_is_the_soft_ce_over_those_columns():
    """Step logits over V': soft CE against the full target's probabilities at V' (the mass outside has no draft
    term), and the acceptance of q scattered into the full vocabulary."""
    torch.manual_seed(3)
    vocab_ids = torch.tensor([0, 2, 3, 5])
    step_logits, target = torch.randn(2, 1, 6, len(vocab_ids)), torch.randn(1, 6, 8) * 2
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    out = eagle3_loss(scored_rows(step_logits, loss_mask), target, loss_mask, vocab_ids=vocab_ids)

    p = torch.softmax(target[0], -1)  # [seq, vocab]
    ce = [-(p[t + k + 1, vocab_ids] * torch.log_softmax(step_logits[k, 0, t], -1)).sum() for k in range(2)
          for t in range(4 - k)]
    q0 = torch.zeros(4, 8).index_copy_(-1, vocab_ids, torch.softmax(step_logits[0, 0, :4], -1))
    accept = (1 - 0.5 * (q0 - p[1:5]).abs().sum(-1)).clamp(0, 1)
    assert out.terms["step0"] == pytest.approx((sum(ce[:4]) / 4).item(), rel=1e-5)
    assert out.terms["step1"] == pytest.approx((sum(ce[4:]) / 4).item(), rel=1e-5)
    assert out.terms["accept"] == pytest.approx((accept.sum() / 4).item(), rel=1e-5)


def _random_block_case(vocab=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn(2, 3, 4, vocab, generator=g)
    target = torch.randn(2, 3, 4, vocab, generator=g) * 2
    labels = torch.randint(0, vocab, (2, 3, 4), generator=g)
    eval_mask = torch.rand(2, 3, 4, generator=g) > 0.2
    conf = torch.randn(2, 3, 4, generator=g)
    return draft, target, labels, eval_mask, conf


def test_a_draft_vocabulary_of_every_token_is_the_full_loss():
    draft, target, labels, eval_mask, conf = _random_block_case()
    full = block_loss(draft, labels, eval_mask, DSPARK_LOSS, target, conf)
    every = block_loss(draft, labels, eval_mask, DSPARK_LOSS, target, conf, vocab_ids=torch.arange(12))
    assert every.terms == pytest.approx(full.terms, rel=1e-6)


def test_the_draft_vocabulary_loss_scores_the_draft_that_vocabulary_proposes():
    """Draft logits over V' score exactly q scattered into the full vocabulary: the L1 (and so c*) against the
    full target, and the CE of the labels inside V'; labels outside add no CE."""
    draft, target, labels, eval_mask, conf = _random_block_case()
    vocab_ids = torch.tensor([0, 2, 3, 5, 8, 11])
    restricted = draft[..., vocab_ids]
    out = block_loss(restricted, labels, eval_mask, DSPARK_LOSS, target, conf, vocab_ids=vocab_ids)

    q = torch.zeros_like(draft).index_copy_(-1, vocab_ids, torch.softmax(restricted, -1))
    l1 = (q - torch.softmax(target, -1)).abs().sum(-1)
    inside = torch.isin(labels, vocab_ids)
    ce = -torch.log(torch.gather(q, -1, labels.unsqueeze(-1)).squeeze(-1).clamp(min=1e-30))
    w = position_weights(eval_mask, DSPARK_LOSS.decay)
    norm = w.sum() + 1e-6
    assert inside.any() and (~inside & eval_mask).any(), "the case has labels on both sides of V'"
    assert out.terms["tv"] == pytest.approx(((w * l1).sum() / norm).item(), rel=1e-5)
    assert out.terms["accept"] == pytest.approx(((w * (1 - 0.5 * l1)).sum() / norm).item(), rel=1e-5)
    assert out.terms["ce"] == pytest.approx(((w * inside * torch.where(inside, ce, 0)).sum() / norm).item(), rel=1e-5)


def test_greedy_loss_hand_computed():
    """--loss greedy on the two-slot case: the CE labels are the target's argmax (token 0 at both supervised
    slots; the data labels are ignored), and the confidence label is the greedy acceptance event. Slot 0's draft
    ties (argmax 0, as torch breaks ties to the first) so it is accepted, and slot 1 too."""
    draft, target, labels, eval_mask, conf = _two_slot_case()
    out = block_loss(draft, torch.ones_like(labels), eval_mask, DSPARK_GREEDY_LOSS, target, conf)
    norm = 1.0 + W1 + 1e-6
    ce = (math.log(2) + W1 * math.log(4 / 3)) / norm
    conf_l = (-math.log(0.75) + W1 * math.log(2)) / norm  # sigma(ln3) = .75 and sigma(0) = .5, both labels 1
    assert out.terms["ce"] == pytest.approx(ce, rel=1e-5)
    assert out.terms["conf"] == pytest.approx(conf_l, rel=1e-5)
    assert out.terms["accept"] == pytest.approx((1.0 + W1) / norm, rel=1e-5)
    assert out.terms["tv"] == pytest.approx(0.5 / norm, rel=1e-5), "logged, not trained"
    assert out.total.item() == pytest.approx(ce + conf_l, rel=1e-5)


def test_greedy_loss_follows_the_targets_argmax_not_the_data():
    """Any data labels give the same greedy loss; its CE is the sampling loss's CE with the target's argmax as
    labels; `accept` is the weighted rate of argmax agreement, over a draft vocabulary mapped back to token ids."""
    draft, target, labels, eval_mask, conf = _random_block_case()
    out = block_loss(draft, labels, eval_mask, DFLASH_GREEDY_LOSS, target)
    other = block_loss(draft, torch.zeros_like(labels), eval_mask, DFLASH_GREEDY_LOSS, target)
    as_data = block_loss(draft, target.argmax(-1), eval_mask, DFLASH_LOSS, target)
    assert out.terms == pytest.approx(other.terms) and out.terms["ce"] == pytest.approx(as_data.terms["ce"])
    vocab_ids = torch.tensor([0, 2, 3, 5, 8, 11])
    restricted = block_loss(draft[..., vocab_ids], labels, eval_mask, DSPARK_GREEDY_LOSS, target, conf,
                            vocab_ids=vocab_ids)
    proposed = vocab_ids[draft[..., vocab_ids].argmax(-1)]
    w = position_weights(eval_mask, 4.0)
    agree = (w * (proposed == target.argmax(-1))).sum() / (w.sum() + 1e-6)
    assert 0 < agree < 1, "the case has both outcomes"
    assert restricted.terms["accept"] == pytest.approx(agree.item(), rel=1e-5)


def test_unknown_label_source_refused():
    with pytest.raises(ConfigError, match="loss labels must be one of data, target_argmax, got 'argmin'"):
        BlockLossWeights(labels="argmin")


@pytest.mark.parametrize("weights", [DSPARK_LOSS, DSPARK_GREEDY_LOSS])
@pytest.mark.parametrize("vocab_ids", [None, torch.tensor([0, 2, 3, 5, 8, 11])])
def test_target_rows_shared_by_slots_give_the_per_slot_loss(weights, vocab_ids):
    """Slots that read one target position share its row (target_rows): the loss, its terms and its gradient are
    those of the same logits copied to every slot."""
    draft, _, labels, eval_mask, conf = _random_block_case()
    draft = (draft if vocab_ids is None else draft[..., vocab_ids]).detach().requires_grad_()
    rows = torch.randn(5, 12, generator=torch.Generator().manual_seed(3)) * 2
    target_rows = torch.randint(0, 5, labels.shape, generator=torch.Generator().manual_seed(4))
    shared = block_loss(draft, labels, eval_mask, weights, rows, conf, vocab_ids=vocab_ids, target_rows=target_rows)
    (grad_shared,) = torch.autograd.grad(shared.total, draft)
    copied = block_loss(draft, labels, eval_mask, weights, rows[target_rows], conf, vocab_ids=vocab_ids)
    (grad_copied,) = torch.autograd.grad(copied.total, draft)
    assert shared.terms == pytest.approx(copied.terms, rel=1e-6)
    assert torch.allclose(grad_shared, grad_copied, atol=1e-7)


def test_eagle3_target_rows_read_once_give_the_every_position_loss():
    """Steps that read one target position share its row: the same loss as target logits at every position."""
    g = torch.Generator().manual_seed(5)
    target = torch.randn(2, 7, 9, generator=g)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0]])
    step_logits = scored_rows(torch.randn(3, 2, 7, 9, generator=g), loss_mask)
    reads = eagle3_target_positions(eagle3_valid_mask(loss_mask, 3))
    distinct, row = torch.unique(torch.cat(reads), return_inverse=True)
    assert len(distinct) < sum(len(r) for r in reads), "the steps share positions"

    shared = eagle3_loss(step_logits, target.flatten(0, 1)[distinct], loss_mask,
                         target_rows=row.split([len(r) for r in reads]))

    assert shared.terms == pytest.approx(eagle3_loss(step_logits, target, loss_mask).terms, rel=1e-6)
