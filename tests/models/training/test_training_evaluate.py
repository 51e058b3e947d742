"""Teacher-forced greedy acceptance: anchor selection and the index conventions of both drafter families; the
small decoded check beside it."""
from types import SimpleNamespace

import pytest
import torch

from dspark.models.training.data import DataConfig, build_dataset
from dspark.models.training.evaluate import decoded_tau, full_block_anchors, greedy_acceptance
from training_helpers import EOS_ID, make_drafter_and_task

GAMMA = 3


def test_full_block_anchors():
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    assert full_block_anchors(loss_mask, 3).int().tolist() == [[0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0]]


class _Oracle(torch.nn.Module):
    """Copies the target's logits into draft positions 1..correct (and garbage after), for either family."""

    def __init__(self, target, kind: str, correct: int) -> None:
        super().__init__()
        self.target, self.correct = target, correct
        self.config = SimpleNamespace(gamma=GAMMA, kind=kind)
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    device, dtype = torch.device("cpu"), torch.float32

    def _spoil(self, logits, k):  # logits [..., vocab] of draft k (0-indexed)
        return logits if k < self.correct else -logits

    def forward_train(self, target_hidden, input_ids, *rest):
        logits = self.target(input_ids).logits  # [bs, seq, vocab]
        if self.config.kind == "eagle3":  # step k at t imitates the target at t+k+1
            return torch.stack([self._spoil(torch.roll(logits, -(k + 1), 1), k) for k in range(GAMMA)])
        anchors = rest[0]
        pos = anchors.unsqueeze(-1) + torch.arange(GAMMA)
        gathered = torch.gather(logits, 1, pos.flatten(1)[..., None].expand(-1, -1, logits.shape[-1]))
        gathered = gathered.view(*pos.shape, -1)
        draft = torch.stack([self._spoil(gathered[:, :, k], k) for k in range(GAMMA)], dim=2)
        vocab_ids = rest[2] if len(rest) > 2 else None
        return SimpleNamespace(draft_logits=draft if vocab_ids is None else draft[..., vocab_ids],
                               confidence_logits=None)


@pytest.fixture(scope="module")
def greedy_data(peaked_target, tiny_documents):
    cfg = DataConfig(num_samples=4, prompt_len=6, response_len=10, temperature=0.0)
    return build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False)


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
@pytest.mark.parametrize("correct", [GAMMA, 1])
def test_oracle_acceptance(kind, correct, peaked_target, greedy_data):
    report = greedy_acceptance(_Oracle(peaked_target, kind, correct), peaked_target, greedy_data, (0, 1))
    assert report.blocks == 4 * (10 - GAMMA)
    expected_prefix = [1.0] * correct + [0.0] * (GAMMA - correct)
    assert report.prefix == expected_prefix
    assert report.tau == pytest.approx(1 + correct)


def test_a_block_drafter_drafts_among_its_draft_vocabulary(peaked_target, greedy_data):
    """Indices into the draft vocabulary are read back as its token ids; a target token outside it is never
    drafted."""
    oracle = _Oracle(peaked_target, "dspark", GAMMA)
    vocab = peaked_target.config.vocab_size
    greedy = set(greedy_data.input_ids[greedy_data.loss_mask].tolist())
    with_them = torch.tensor(sorted(greedy | {vocab - 1}))
    without_them = torch.tensor(sorted(set(range(vocab)) - greedy))
    assert greedy_acceptance(oracle, peaked_target, greedy_data, (0, 1), vocab_ids=with_them).tau == pytest.approx(4)
    assert greedy_acceptance(oracle, peaked_target, greedy_data, (0, 1), vocab_ids=without_them).tau == 1.0


def test_the_decoded_check_drafts_among_the_vocabulary_and_leaves_the_drafter_as_it_was(peaked_target, greedy_data):
    """Decoding the held-out prompts with a draft vocabulary that lacks every token the target says greedily there
    accepts no draft: exactly one token per round. Afterwards the drafter is back in training mode, drafting over
    the full vocabulary, as the training step expects."""
    drafter, _ = make_drafter_and_task("dspark", peaked_target, gamma=GAMMA, layer_ids=(0, 1))
    drafter.train()
    said = set(greedy_data.input_ids[greedy_data.loss_mask].tolist())
    without = torch.tensor(sorted(set(range(peaked_target.config.vocab_size)) - said))
    assert decoded_tau(drafter, peaked_target, greedy_data, (EOS_ID,), max_new_tokens=8, vocab_ids=without) == 1.0
    assert drafter.training and drafter.draft_vocab is None
    full = decoded_tau(drafter, peaked_target, greedy_data, (EOS_ID,), max_new_tokens=8)
    assert 1.0 < full <= GAMMA + 1, "over the full vocabulary some drafts pass, so the 1.0 above is the vocabulary's"
