"""Compact drafter checkpoints: a drafter trained over its draft vocabulary stores the Markov tables' rows of those
tokens only; load_drafter scatters them back (zeros elsewhere), and SGLang is handed a full-row copy."""
import pytest
import torch
from safetensors import safe_open

from dspark.models.checkpoint import (DRAFT_VOCAB_ROWS, is_compact, load_drafter, save_drafter, sglang_checkpoint,
                                      stores_frozen_weights)
from dspark.models.drafters.draft_vocab import save_draft_vocab
from dspark.models.errors import CheckpointError
from tests.models.drafters.drafter_helpers import make_drafter


def rows(path, name):
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return handle.get_slice(name).get_shape()[0]


@pytest.fixture()
def compact(tiny_target, tmp_path):
    """(drafter, its draft vocabulary, a slim compact checkpoint of it)."""
    drafter = make_drafter(tiny_target, "dspark_vanilla")
    vocab = torch.arange(3, drafter.config.vocab_size, 5)
    path = save_drafter(drafter, tmp_path / "compact", frozen=False, draft_vocab=vocab)
    save_draft_vocab(path, vocab, source="test", counted_tokens=100, coverage=1.0)
    return drafter, vocab, path


def test_compact_checkpoint_stores_draft_vocabulary_rows_only(compact):
    drafter, vocab, path = compact
    assert is_compact(path) and not stores_frozen_weights(path)
    assert {rows(path, name) for name in DRAFT_VOCAB_ROWS} == {len(vocab)}


def test_compact_checkpoint_loads_the_draft_vocabulary_rows_and_zeros_elsewhere(tiny_target, compact):
    drafter, vocab, path = compact
    loaded = load_drafter(path, target_model=tiny_target).state_dict()
    original = drafter.state_dict()
    outside = torch.ones(drafter.config.vocab_size, dtype=torch.bool)
    outside[vocab] = False
    for name in original:
        if name in DRAFT_VOCAB_ROWS:
            assert torch.equal(loaded[name][vocab], original[name][vocab])
            assert not loaded[name][outside].any()
        else:
            assert torch.equal(loaded[name], original[name]), name


def test_compact_rows_without_a_matching_draft_vocabulary_are_refused(tiny_target, compact):
    _, vocab, path = compact
    save_draft_vocab(path, vocab[:-1], source="test", counted_tokens=100, coverage=1.0)
    with pytest.raises(CheckpointError, match=rf"hold \[{len(vocab)}\] rows.*draft_vocab.json: {len(vocab) - 1} tokens"):
        load_drafter(path, target_model=tiny_target)


def test_sglang_gets_a_full_row_copy_once_and_full_checkpoints_as_they_are(tiny_target, compact, tmp_path):
    drafter, vocab, path = compact
    copy = sglang_checkpoint(path, tmp_path / "cache")
    assert copy.parent == tmp_path / "cache" / "sglang-drafters" and not is_compact(copy)
    assert {rows(copy, name) for name in DRAFT_VOCAB_ROWS} == {drafter.config.vocab_size}
    assert not stores_frozen_weights(copy)  # SGLang shares the target's embedding and lm_head
    written = (copy / "model.safetensors").stat().st_mtime_ns
    assert sglang_checkpoint(path, tmp_path / "cache") == copy
    assert (copy / "model.safetensors").stat().st_mtime_ns == written
    for name, tensor in load_drafter(copy, target_model=tiny_target).state_dict().items():
        assert torch.equal(tensor, load_drafter(path, target_model=tiny_target).state_dict()[name])
    full = save_drafter(drafter, tmp_path / "full", frozen=False)
    assert sglang_checkpoint(full, tmp_path / "cache") == full
