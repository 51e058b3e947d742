"""The draft vocabulary (models/drafters/draft_vocab.py): how it is chosen, stored, refused and applied."""
import json
import os
import re

import pytest
import torch
from torch import nn

from dspark.kernels.warping import SamplingParams
from dspark.models.drafters.base import DraftBlock
from dspark.models.drafters.draft_vocab import (DRAFT_VOCAB_FILE, DraftVocab, load_draft_vocab, most_frequent,
                                                save_draft_vocab)
from dspark.models.errors import CheckpointError


def test_most_frequent_keeps_the_commonest_tokens_sorted_with_their_coverage():
    tokens = torch.tensor([5, 5, 5, 2, 2, 9, 7, 7, 7, 7])
    ids, coverage = most_frequent(tokens, vocab_size=10, size=3)
    assert ids.tolist() == [2, 5, 7] and coverage == pytest.approx(0.9)
    ids, coverage = most_frequent(tokens, vocab_size=10, size=2)  # a tie between 2 and 9 would go to 2
    assert ids.tolist() == [5, 7] and coverage == pytest.approx(0.7)


def test_most_frequent_returns_fewer_when_fewer_tokens_occur():
    ids, coverage = most_frequent(torch.tensor([[3, 1], [3, 3]]), vocab_size=100, size=50)
    assert ids.tolist() == [1, 3] and coverage == 1.0
    with pytest.raises(ValueError, match="at least one token"):
        most_frequent(torch.tensor([1]), vocab_size=4, size=0)


def test_most_frequent_keeps_a_given_vocabulary_whole_and_fills_the_rest_by_frequency():
    tokens = torch.tensor([5, 5, 5, 2, 2, 9, 7, 7, 7, 7])
    ids, coverage = most_frequent(tokens, vocab_size=10, size=3, keep=torch.tensor([1, 9]))
    assert ids.tolist() == [1, 7, 9] and coverage == pytest.approx(0.5)  # 1 never occurs, yet stays
    ids, _ = most_frequent(tokens, vocab_size=10, size=2, keep=torch.tensor([1, 2, 9]))
    assert ids.tolist() == [1, 2, 9], "a kept vocabulary larger than size stays whole"
    ids, coverage = most_frequent(tokens, vocab_size=10, size=8, keep=torch.tensor([2]))
    assert ids.tolist() == [2, 5, 7, 9] and coverage == 1.0


def test_a_saved_vocabulary_loads_back(tmp_path):
    save_draft_vocab(tmp_path, torch.tensor([0, 4, 9]), "a test", counted_tokens=12, coverage=0.75)
    assert load_draft_vocab(tmp_path, vocab_size=10).tolist() == [0, 4, 9]
    assert json.loads((tmp_path / DRAFT_VOCAB_FILE).read_text())["coverage"] == 0.75


def test_a_drafter_without_one_drafts_everything(tmp_path):
    assert load_draft_vocab(tmp_path, vocab_size=10) is None


@pytest.mark.parametrize("text, problem", [
    ("not json", "is not a draft vocabulary"),
    ('{"ids": [1, 2]}', "is not a draft vocabulary"),
    ('{"token_ids": []}', "non-empty list of integers"),
    ('{"token_ids": [1, 2.5]}', "non-empty list of integers"),
    ('{"token_ids": [3, 1]}', "sorted, distinct and in [0, 10)"),
    ('{"token_ids": [1, 1]}', "sorted, distinct and in [0, 10)"),
    ('{"token_ids": [1, 10]}', "sorted, distinct and in [0, 10)"),
    ('{"token_ids": [-1, 3]}', "sorted, distinct and in [0, 10)"),
    ("[" * 100_000, "is not a draft vocabulary"),
    ('{"token_ids": [1' + "0" * 5000 + "]}", "is not a draft vocabulary"),
])
def test_a_malformed_vocabulary_is_refused_by_name(tmp_path, text, problem):
    (tmp_path / DRAFT_VOCAB_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / DRAFT_VOCAB_FILE)) + ".*" + re.escape(problem)):
        load_draft_vocab(tmp_path, vocab_size=10)


def test_the_restricted_heads_are_the_rows_of_its_tokens():
    head, w2 = nn.Linear(4, 10, bias=False), torch.randn(10, 3)
    vocab = DraftVocab(torch.tensor([1, 6, 8]), head, w2)
    hidden = torch.randn(2, 4)
    torch.testing.assert_close(vocab.head(hidden), head(hidden)[:, [1, 6, 8]])
    torch.testing.assert_close(vocab.markov_w2, w2[[1, 6, 8]])
    assert not vocab.head.weight.requires_grad and set(vocab.state_dict()) == {"head.weight"}


def test_the_draft_distribution_is_zero_outside_the_vocabulary():
    vocab = DraftVocab(torch.tensor([1, 6, 8]), nn.Linear(4, 10, bias=False))
    logits = torch.log(torch.tensor([[[0.2, 0.3, 0.5]]]))
    block = DraftBlock(tokens=torch.tensor([[8]]), logits=logits, confidence_logits=None,
                       sampling=SamplingParams(1.0), vocab=vocab)
    expected = torch.zeros(1, 1, 10)
    expected[0, 0, [1, 6, 8]] = torch.tensor([0.2, 0.3, 0.5])
    torch.testing.assert_close(block.probs(), expected)


def test_a_vocabulary_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    os.mkfifo(tmp_path / DRAFT_VOCAB_FILE)  # a read would block until a writer came
    with pytest.raises(CheckpointError, match="draft_vocab.json does not exist or is not a file"):
        load_draft_vocab(tmp_path, vocab_size=10)
