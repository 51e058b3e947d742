"""Anchor sampling invariants (docs/training.md, "Anchors")."""
import torch

from dspark.models.training.anchors import (
    DUMMY_ANCHOR,
    anchor_candidates,
    block_targets,
    sample_anchors,
    sample_blocks,
)


def _mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_candidates_need_anchor_and_first_label_trained():
    loss_mask = _mask([[0, 0, 1, 1, 1, 0, 1, 1]])
    assert anchor_candidates(loss_mask).int().tolist() == [[0, 0, 1, 1, 0, 0, 1, 0]]


def test_anchors_are_distinct_sorted_candidates_then_dummies():
    g = torch.Generator().manual_seed(0)
    loss_mask = torch.zeros(3, 40, dtype=torch.bool)
    loss_mask[0, 5:40] = True  # 34 candidates
    loss_mask[1, 10:14] = True  # 3 candidates: 10, 11, 12
    loss_mask[2, 0] = True  # no candidate
    anchors, keep = sample_anchors(loss_mask, n_anchors=8, generator=g)
    cand = anchor_candidates(loss_mask)
    assert keep.sum(1).tolist() == [8, 3, 0]
    for b in range(3):
        kept = anchors[b][keep[b]]
        assert torch.all(kept[1:] > kept[:-1]), "kept anchors strictly increasing"
        assert cand[b, kept].all()
        n_keep = int(keep[b].sum())
        assert keep[b, :n_keep].all() and not keep[b, n_keep:].any(), "block_keep is a prefix"
        assert (anchors[b][~keep[b]] == DUMMY_ANCHOR).all()
    assert anchors[1, :3].tolist() == [10, 11, 12]


def test_more_anchors_than_positions_pads_with_dummies():
    g = torch.Generator().manual_seed(0)
    anchors, keep = sample_anchors(torch.ones(1, 4, dtype=torch.bool), n_anchors=10, generator=g)
    assert anchors.shape == (1, 10)
    assert anchors[0, :3].tolist() == [0, 1, 2] and keep[0].sum() == 3


def test_sampling_is_uniform_over_candidates():
    g = torch.Generator().manual_seed(1)
    loss_mask = torch.zeros(1, 12, dtype=torch.bool)
    loss_mask[0, 2:12] = True  # candidates 2..10 (9 of them)
    counts = torch.zeros(12)
    for _ in range(900):
        anchors, keep = sample_anchors(loss_mask, n_anchors=3, generator=g)
        counts.index_add_(0, anchors[0][keep[0]], torch.ones(3))
    assert counts[:2].sum() == 0 and counts[11] == 0
    # Each candidate is drawn with probability 1/3: about 300 of 900, binomial sd ~14.
    assert torch.all((counts[2:11] - 300).abs() < 70), counts


def test_same_generator_state_same_anchors():
    loss_mask = torch.ones(2, 50, dtype=torch.bool)
    a1, _ = sample_anchors(loss_mask, 6, torch.Generator().manual_seed(7))
    a2, _ = sample_anchors(loss_mask, 6, torch.Generator().manual_seed(7))
    assert torch.equal(a1, a2)


def test_labels_and_eval_mask_cumprod():
    input_ids = torch.arange(10, 20).unsqueeze(0)  # x_i = 10 + i
    loss_mask = _mask([[0, 1, 1, 1, 1, 1, 0, 1, 1, 1]])
    anchors = torch.tensor([[1, 4, 8, 0]])
    keep = torch.tensor([[True, True, True, False]])
    labels, eval_mask = block_targets(input_ids, loss_mask, anchors, keep, gamma=3)
    assert labels[0, 0].tolist() == [12, 13, 14]
    assert labels[0, 2].tolist() == [19, 0, 0], "past the end -> 0"
    assert eval_mask[0].int().tolist() == [
        [1, 1, 1],
        [1, 0, 0],  # x_6 untrained: label 7 is trained again but the prefix stops
        [1, 0, 0],  # runs off the sequence
        [0, 0, 0],  # dummy
    ]


def test_sample_blocks_positions():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (2, 30))
    blocks = sample_blocks(ids, torch.ones(2, 30, dtype=torch.bool), n_anchors=4, gamma=5, generator=g)
    assert blocks.labels.shape == (2, 4, 5) and blocks.eval_mask.shape == (2, 4, 5)
    assert torch.equal(blocks.positions[..., 0], blocks.anchors)
    assert torch.equal(blocks.eval_mask[..., 0], blocks.block_keep)
    sel = blocks.eval_mask
    next_tokens = torch.gather(ids, 1, (blocks.positions + 1).clamp(max=29).flatten(1)).view_as(sel)
    assert torch.equal(blocks.labels[sel], next_tokens[sel])
