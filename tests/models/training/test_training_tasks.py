"""TargetOutputs and the tasks: the target's logits where a loss reads them, each slot or step at its own position."""
from types import SimpleNamespace

import pytest
import torch

from dspark.models.training.anchors import sample_blocks
from dspark.models.training.data import TokenDataset
from dspark.models.training.losses import DSPARK_LOSS, block_loss, eagle3_loss, eagle3_valid_mask
from dspark.models.training.tasks import BlockTask, Eagle3Task, TargetOutputs


def test_distinct_logits_computes_each_position_once_and_maps_every_read_to_it():
    last_hidden = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    head = torch.nn.Linear(3, 7, bias=False)
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    outputs = TargetOutputs(hidden=last_hidden, last_hidden=last_hidden, lm_head=head)
    positions = torch.tensor([[1, 2, 2, 3, 1], [5, 5, 9, 9, 9]])  # into the 2 x 5 positions, flattened

    rows, row = outputs.distinct_logits(positions)

    assert calls == [5], "five distinct positions, each through the head once"
    assert row.shape == positions.shape
    assert torch.allclose(rows[row], outputs.logits().flatten(0, 1)[positions], atol=1e-6)


class _FixedDrafter(torch.nn.Module):
    """Stands in for drafter.forward_train: logits that depend on the blocks' anchors, so a mis-wired slot shows."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(64, width, generator=torch.Generator().manual_seed(1)))

    def forward(self, anchors=None, ttt_steps=None, scored=None, vocab_ids=None, **unused):
        self.vocab_ids = vocab_ids
        if scored is not None:  # Eagle3: ttt_steps x [m_k, vocab]
            return [self.table[(k + scored[k].nonzero()[:, 1]) % 64] for k in range(ttt_steps)]
        gamma = 3
        rows = (anchors.unsqueeze(-1) + torch.arange(gamma)) % 64  # [bs, n, gamma]
        return SimpleNamespace(draft_logits=self.table[rows], confidence_logits=self.table[rows][..., 0])


def _outputs(bs=2, seq=12, hidden=4, vocab=10):
    g = torch.Generator().manual_seed(2)
    last_hidden = torch.randn(bs, seq, hidden, generator=g)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    torch.nn.init.normal_(head.weight, generator=g)
    return TargetOutputs(hidden=last_hidden, last_hidden=last_hidden, lm_head=head)


def _batch(bs=2, seq=12):
    loss_mask = torch.zeros(bs, seq, dtype=torch.long)
    loss_mask[0, 4:] = 1
    loss_mask[1, 6:10] = 1  # right padding after position 9
    return TokenDataset(torch.randint(0, 10, (bs, seq), generator=torch.Generator().manual_seed(3)), loss_mask,
                        (torch.arange(seq) < torch.tensor([[seq], [10]])).long())


@pytest.mark.parametrize("vocab_ids", [None, torch.tensor([0, 3, 4, 7, 9])])
def test_the_block_task_scores_each_slot_against_the_targets_logits_at_its_own_position(vocab_ids):
    outputs, batch = _outputs(), _batch()
    task = BlockTask((0,), gamma=3, n_anchors=4, weights=DSPARK_LOSS, vocab_ids=vocab_ids)
    drafter = _FixedDrafter(10 if vocab_ids is None else len(vocab_ids))
    loss = task.loss(drafter, batch, outputs, torch.Generator().manual_seed(4), lambda x: x)
    assert drafter.vocab_ids is vocab_ids or torch.equal(drafter.vocab_ids, vocab_ids)

    blocks = sample_blocks(batch.input_ids, batch.loss_mask, 4, 3, torch.Generator().manual_seed(4))
    out = drafter(anchors=blocks.anchors)
    per_slot = outputs.logits()[torch.arange(2).view(2, 1, 1), blocks.positions.clamp(max=11)]
    expected = block_loss(out.draft_logits, blocks.labels, blocks.eval_mask, DSPARK_LOSS, per_slot,
                          out.confidence_logits, vocab_ids=vocab_ids)
    assert blocks.eval_mask[1].any(), "the second sequence is scored: its rows must not be the first's"
    assert loss.terms == pytest.approx(expected.terms, rel=1e-6)


@pytest.mark.parametrize("vocab_ids", [None, torch.tensor([0, 3, 4, 7, 9])])
def test_the_eagle3_task_scores_step_k_at_t_against_the_targets_logits_at_t_plus_k_plus_1(vocab_ids):
    outputs, batch = _outputs(), _batch()
    drafter = _FixedDrafter(10 if vocab_ids is None else len(vocab_ids))
    loss = Eagle3Task((0,), ttt_steps=3, vocab_ids=vocab_ids).loss(drafter, batch, outputs, None, lambda x: x)
    assert drafter.vocab_ids is vocab_ids or torch.equal(drafter.vocab_ids, vocab_ids)

    scored = eagle3_valid_mask(batch.loss_mask, 3)
    reads = [scored[k].nonzero() @ torch.tensor([12, 1]) + k + 1 for k in range(3)]  # b·seq + t+k+1
    expected = eagle3_loss(drafter(ttt_steps=3, scored=scored), outputs.logits().flatten(0, 1), batch.loss_mask,
                           target_rows=reads, vocab_ids=vocab_ids)
    assert loss.terms == pytest.approx(expected.terms, rel=1e-6)
