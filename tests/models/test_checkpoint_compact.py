"""Compact drafter checkpoints: a drafter trained over its draft vocabulary stores the Markov tables' rows of those
tokens only; load_drafter scatters them back (zeros elsewhere), and SGLang is handed a full-row copy. A compact
Eagle3 is SGLang's own draft-vocabulary layout (lm_head rows and d2t), served as it is."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark.models.checkpoint import (D2T, DRAFT_VOCAB_ROWS, is_compact, load_drafter, save_drafter, sglang_checkpoint,
                                      stores_frozen_weights)
from dspark.models.drafters.draft_vocab import save_draft_vocab
from dspark.models.errors import CheckpointError
from dspark.ops.cli import main
from tests.models.drafters.drafter_helpers import make_drafter


def rows(path, name):
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return handle.get_slice(name).get_shape()[0]


def compact_checkpoint(target, variant: str, directory):
    """(drafter, its draft vocabulary, a slim compact checkpoint of it with its draft_vocab.json)."""
    drafter = make_drafter(target, variant)
    vocab = torch.arange(3, drafter.config.vocab_size, 5)
    path = save_drafter(drafter, directory, frozen=False, draft_vocab=vocab)
    save_draft_vocab(path, vocab, source="test", counted_tokens=100, coverage=1.0)
    return drafter, vocab, path


@pytest.fixture()
def compact(tiny_target, tmp_path):
    return compact_checkpoint(tiny_target, "dspark_vanilla", tmp_path / "compact")


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


@pytest.fixture()
def eagle3_compact(tiny_target, tmp_path):
    return compact_checkpoint(tiny_target, "eagle3", tmp_path / "eagle3")


def test_a_compact_eagle3_is_sglangs_draft_vocabulary_layout_served_as_it_is(tiny_target, eagle3_compact, tmp_path):
    drafter, vocab, path = eagle3_compact
    assert json.loads((path / "config.json").read_text())["draft_vocab_size"] == len(vocab)
    tensors = load_file(str(path / "model.safetensors"))
    assert torch.equal(tensors["lm_head.weight"], drafter.lm_head.weight[vocab])
    assert torch.equal(tensors[D2T] + torch.arange(len(vocab)), vocab)  # SGLang's hot_token_id
    assert "embed_tokens.weight" not in tensors and not stores_frozen_weights(path)
    assert sglang_checkpoint(path, tmp_path / "cache") == path


def test_dspark_check_says_a_compact_eagle3_keeps_its_draft_rows(tiny_target, eagle3_compact, tmp_path, capsys):
    tiny_target.save_pretrained(tmp_path / "target")
    assert main(["check", str(eagle3_compact[2]), "--target", str(tmp_path / "target")]) == 0
    assert ("(embed_tokens.weight, lm_head.weight rows outside the draft vocabulary taken from the target)"
            in capsys.readouterr().out)


def test_a_compact_eagle3_loads_whole_from_the_target(tiny_target, eagle3_compact):
    drafter, _, path = eagle3_compact
    loaded = load_drafter(path, target_model=tiny_target).state_dict()
    assert loaded.keys() == drafter.state_dict().keys()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_a_compact_eagle3_keeps_the_head_rows_it_stores(tiny_target, eagle3_compact):
    """An EAGLE-3 may train its own draft head: its rows, not the target's, draft; the others stay the target's."""
    _, vocab, path = eagle3_compact
    tensors = load_file(str(path / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1.0
    save_file(tensors, str(path / "model.safetensors"))
    head = load_drafter(path, target_model=tiny_target).lm_head.weight
    outside = torch.ones(len(head), dtype=torch.bool)
    outside[vocab] = False
    assert torch.equal(head[vocab], tensors["lm_head.weight"])
    assert torch.equal(head[outside], tiny_target.lm_head.weight[outside])


@pytest.mark.parametrize("listed, error", [("others", "lists others"), ("none", "is missing")])
def test_a_compact_eagle3_whose_d2t_is_not_its_draft_vocabulary_is_refused(tiny_target, eagle3_compact, listed, error):
    _, vocab, path = eagle3_compact
    if listed == "none":
        (path / "draft_vocab.json").unlink()
    else:
        save_draft_vocab(path, vocab - 1, source="test", counted_tokens=100, coverage=1.0)
    with pytest.raises(CheckpointError, match=rf"d2t names {len(vocab)} draft tokens, and draft_vocab.json .*{error}"):
        load_drafter(path, target_model=tiny_target)


@pytest.mark.parametrize("damage, error", [
    (lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:, :-1]}), r"lm_head.weight must be \[13, \d+\]"),
    (lambda t: t.pop("lm_head.weight"), "it has none"),
    (lambda t: t.update({"d2t": t["d2t"].view(1, -1)}), "one offset a draft token, got shape"),
])
def test_a_compact_eagle3_whose_draft_head_is_malformed_is_refused(tiny_target, eagle3_compact, damage, error):
    _, _, path = eagle3_compact
    tensors = load_file(str(path / "model.safetensors"))
    damage(tensors)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=error):
        load_drafter(path, target_model=tiny_target)
