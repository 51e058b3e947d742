"""The chat data source: left-padded generation is exact, rows are stored [prompt, response, padding]."""
import pytest
import torch

from dspark.models.errors import ConfigError
from dspark.models.training.data import DataConfig, build_dataset, continue_prompts, right_align

from training_helpers import EOS_ID


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 64, (n,), generator=g) for n in lengths]


class _Recording(torch.nn.Module):
    """Wraps a target and records the next-token logits of every call."""

    def __init__(self, target):
        super().__init__()
        self.target, self.seen = target, []

    def forward(self, **kwargs):
        out = self.target(**kwargs)
        self.seen.append(out.logits[:, -1])
        return out


def _step_logits(target, prompts, cfg, mask=None):
    recording = _Recording(target)
    continue_prompts(recording, prompts, cfg, EOS_ID, torch.Generator(), prompt_mask=mask)
    return torch.stack(recording.seen, dim=1)  # [bs, steps, vocab]


def test_left_padded_prompts_continue_as_they_would_alone(tiny_target):
    prompts = _prompts((3, 7, 5))
    cfg = DataConfig(prompt_len=7, response_len=4, temperature=0.0)
    padded = torch.full((3, 7), EOS_ID)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    for row, p in enumerate(prompts):
        padded[row, 7 - len(p):], mask[row, 7 - len(p):] = p, True
    batch = _step_logits(tiny_target, padded, cfg, mask)
    unmasked = _step_logits(tiny_target, padded, cfg)
    for row, p in enumerate(prompts):
        alone = _step_logits(tiny_target, p[None], cfg)[0]
        torch.testing.assert_close(batch[row], alone, atol=1e-5, rtol=1e-5)
        if len(p) < 7:  # the check can fail: attending to the padding changes the logits
            assert not torch.allclose(unmasked[row], alone, atol=1e-3)


def test_chat_rows_are_prompt_then_response_then_masked_padding(peaked_target):
    prompts = _prompts((4, 9, 6, 12, 3, 30))  # the 30-token prompt exceeds prompt_len and is never used
    cfg = DataConfig(source="chat", num_samples=5, prompt_len=12, response_len=5, generation_batch_size=2,
                     temperature=0.0)
    data = build_dataset(prompts, cfg, peaked_target, EOS_ID, progress=False)
    assert data.input_ids.shape == (5, 17)
    used = sorted(len(p) for p in prompts if len(p) <= 12)
    lengths = []
    for row in range(5):
        n_prompt = int((data.attention_mask[row] & ~data.loss_mask[row]).sum())
        lengths.append(n_prompt)
        assert data.input_ids[row, :n_prompt].tolist() in [p.tolist() for p in prompts]
        # the attended tokens are one contiguous run from position 0; loss on the response part only
        n_attended = int(data.attention_mask[row].sum())
        assert data.attention_mask[row, :n_attended].all() and not data.attention_mask[row, n_attended:].any()
        assert data.loss_mask[row].tolist() == [False] * n_prompt + [True] * (n_attended - n_prompt) + \
            [False] * (17 - n_attended)
        assert (data.input_ids[row, n_attended:] == EOS_ID).all()
        assert n_attended - n_prompt == 5  # greedy peaked target: no early EOS
    assert sorted(lengths) == used


def test_chat_source_is_deterministic_and_rejects_too_few_prompts(peaked_target):
    prompts = _prompts((4, 9, 6, 12, 3))
    cfg = DataConfig(source="chat", num_samples=4, prompt_len=12, response_len=4, generation_batch_size=3, seed=5)
    a = build_dataset(prompts, cfg, peaked_target, EOS_ID, progress=False)
    b = build_dataset(prompts, cfg, peaked_target, EOS_ID, progress=False)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    with pytest.raises(ConfigError, match="only 3 of 5 chat prompts have <= 6 tokens"):
        build_dataset(prompts, DataConfig(source="chat", num_samples=4, prompt_len=6), peaked_target, EOS_ID)


def test_right_align_moves_left_padding_to_the_end():
    from dspark.models.training.data import TokenDataset
    ids = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 7, 8, 9]])
    attention = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    loss = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.bool)
    out = right_align(TokenDataset(ids, loss, attention), 6, pad_id=0)
    assert out.input_ids.tolist() == [[7, 8, 9, 0, 0, 0], [5, 6, 7, 8, 9, 0]]
    assert out.attention_mask.int().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert out.loss_mask.int().tolist() == [[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0]]
