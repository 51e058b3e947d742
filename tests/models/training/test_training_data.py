"""Training data: windows, sampling filters, target continuations, EOS handling, cache."""
from types import SimpleNamespace

import pytest
import torch

from dspark.models.errors import ConfigError
from dspark.models.training.data import (
    DataConfig,
    build_dataset,
    continue_prompts,
    load_dataset,
    next_tokens,
    sample_windows,
    save_dataset,
)

from training_helpers import EOS_ID


def test_windows_come_from_long_enough_documents(tiny_documents):
    windows = sample_windows(tiny_documents, 20, 50, torch.Generator().manual_seed(0))
    assert windows.shape == (50, 20)
    joined = [doc.tolist() for doc in tiny_documents]
    for row in windows.tolist():
        assert any(row == doc[i : i + 20] for doc in joined for i in range(len(doc) - 19))
    with pytest.raises(ConfigError, match="no training document"):
        sample_windows(tiny_documents, 1000, 1, torch.Generator())


def test_greedy_continuation_equals_hf_generate(peaked_target):
    prompts = torch.randint(2, 64, (3, 5), generator=torch.Generator().manual_seed(1))
    cfg = DataConfig(prompt_len=5, response_len=6, temperature=0.0)
    data = continue_prompts(peaked_target, prompts, cfg, EOS_ID, torch.Generator())
    reference = peaked_target.generate(
        prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=6, eos_token_id=-1
    )
    assert torch.equal(data.input_ids, reference)
    assert data.loss_mask.int().tolist() == [[0] * 5 + [1] * 6] * 3


class _EosAfter(torch.nn.Module):
    """A fake target that emits token 5, then EOS at the `eos_step`-th response token, for every row."""

    def __init__(self, eos_step: int) -> None:
        super().__init__()
        self.eos_step, self.calls = eos_step, 0
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **_):
        token = EOS_ID if self.calls == self.eos_step else 5
        self.calls += 1
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], 8), -10.0)
        logits[..., token] = 10.0
        return SimpleNamespace(logits=logits)


def test_top_k_first_sampling_keeps_the_warped_distribution():
    from dspark.kernels import warping

    cfg = DataConfig(temperature=0.7, top_k=5, top_p=0.8)
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(0)) * 3
    draws = next_tokens(logits.expand(20000, -1), cfg, torch.Generator().manual_seed(1))
    expected = warping.probs(logits, warping.SamplingParams(0.7, 5, 0.8))[0]
    observed = torch.bincount(draws, minlength=64).float() / draws.numel()
    assert torch.allclose(observed, expected, atol=0.015), (observed[expected > 0], expected[expected > 0])
    assert (observed[expected == 0] == 0).all(), "never a token the warping drops"


def test_eos_is_trained_and_followed_by_masked_padding():
    cfg = DataConfig(prompt_len=2, response_len=5, temperature=0.0)
    data = continue_prompts(_EosAfter(eos_step=2), torch.tensor([[3, 4]]), cfg, EOS_ID, torch.Generator())
    assert data.input_ids.tolist() == [[3, 4, 5, 5, EOS_ID, EOS_ID, EOS_ID]]
    assert data.loss_mask.int().tolist() == [[0, 0, 1, 1, 1, 0, 0]]
    assert data.attention_mask.int().tolist() == [[1, 1, 1, 1, 1, 0, 0]]


def test_sampled_dataset_is_seeded_and_shaped(peaked_target, tiny_documents):
    cfg = DataConfig(num_samples=6, prompt_len=8, response_len=6, generation_batch_size=4, seed=3)
    a = build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False)
    b = build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False)
    assert a.input_ids.shape == (6, 14) and torch.equal(a.input_ids, b.input_ids)
    assert not a.loss_mask[:, :8].any()
    c = build_dataset(tiny_documents, DataConfig(**{**cfg.__dict__, "seed": 4}), peaked_target, EOS_ID, progress=False)
    assert not torch.equal(a.input_ids, c.input_ids)


class _Interrupted(Exception):
    pass


class _Counting(torch.nn.Module):
    """The target, counting its forwards, and interrupted (as a killed run is) at forward `stop_at` if given."""

    def __init__(self, target: torch.nn.Module, stop_at: int | None = None) -> None:
        super().__init__()
        self.target, self.stop_at, self.calls = target, stop_at, 0

    def forward(self, **kwargs):
        self.calls += 1
        if self.calls == self.stop_at:
            raise _Interrupted
        return self.target(**kwargs)


def test_an_interrupted_generation_resumes_to_the_dataset_of_an_uninterrupted_one(peaked_target, tiny_documents,
                                                                                  tmp_path):
    cfg = DataConfig(num_samples=10, prompt_len=8, response_len=6, generation_batch_size=4, seed=3)  # 3 batches
    whole = _Counting(peaked_target)
    expected = build_dataset(tiny_documents, cfg, whole, EOS_ID, progress=False)
    partial = tmp_path / "data.partial.pt"
    with pytest.raises(_Interrupted):  # in the second batch: the first takes at most 1 prefill + 5 decode forwards
        build_dataset(tiny_documents, cfg, _Counting(peaked_target, stop_at=8), EOS_ID, progress=False, partial=partial)
    assert len(torch.load(partial)["parts"]) == 1
    cut = tmp_path / "cut.partial.pt"  # a partial file a kill cut short is started over, not a traceback
    cut.write_bytes(partial.read_bytes()[:64])
    assert torch.equal(build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False,
                                     partial=cut).input_ids, expected.input_ids)
    resumed = _Counting(peaked_target)
    dataset = build_dataset(tiny_documents, cfg, resumed, EOS_ID, progress=False, partial=partial)
    assert resumed.calls < whole.calls  # the first batch was not generated again
    for field in ("input_ids", "loss_mask", "attention_mask"):
        assert torch.equal(getattr(dataset, field), getattr(expected, field)), field


def test_corpus_source_masks_the_prompt(tiny_documents):
    cfg = DataConfig(source="corpus", num_samples=4, prompt_len=3, response_len=5)
    data = build_dataset(tiny_documents, cfg)
    assert data.loss_mask.int().tolist() == [[0, 0, 0, 1, 1, 1, 1, 1]] * 4


def test_cache_round_trip_only_for_the_same_key(tmp_path, tiny_documents):
    cfg = DataConfig(source="corpus", num_samples=4, prompt_len=3, response_len=5)
    data = build_dataset(tiny_documents, cfg)
    path = tmp_path / "data.pt"
    save_dataset(data, {"data": cfg.__dict__, "target": "abc"}, path)
    loaded = load_dataset(path, {"data": cfg.__dict__, "target": "abc"})
    assert loaded is not None and torch.equal(loaded.input_ids, data.input_ids)
    assert load_dataset(path, {"data": cfg.__dict__, "target": "other"}) is None
    path.write_bytes(path.read_bytes()[:100])  # a save a kill cut short: a miss, and the dataset is built again
    assert load_dataset(path, {"data": cfg.__dict__, "target": "abc"}) is None
    path.with_suffix(".json").write_bytes(b"\xff{")
    assert load_dataset(path, {"data": cfg.__dict__, "target": "abc"}) is None


def test_data_config_validation():
    with pytest.raises(ConfigError, match="source"):
        DataConfig(source="web")
    with pytest.raises(ConfigError, match=r"data prompt_len must be in \[1, 1048576\], got 1000000000000"):
        DataConfig(prompt_len=10 ** 12)
    with pytest.raises(ConfigError, match=r"data num_samples must be in \[1, 10000000\], got 0"):
        DataConfig(num_samples=0)
    # the replies' sampling is checked as `dspark regenerate` checks it (ReplySampling), flags named
    with pytest.raises(ConfigError, match=r"--top-p must be in \(0, 1\], got 0.0"):
        DataConfig(top_p=0.0)
    with pytest.raises(ConfigError, match=r"--temperature must be in \[0, 100\], got 1000.0"):
        DataConfig(temperature=1000.0)
