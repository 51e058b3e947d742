"""The ragged target cache: holes and compaction never change what the target computes."""
import pytest
import torch

from dspark.models.decoding import target as target_module
from dspark.models.decoding.engine import GenerationConfig, SpeculativeDecoder
from dspark.models.decoding.target import TargetRunner
from dspark.models.target_features import LayerTap, capture_target_features, decoder_layers


def test_holes_and_compaction_leave_logits_unchanged(embedded_target, prompts, monkeypatch):
    """Row 0 commits 1 of 4 slots per forward, row 1 2 of 4; logits match a plain forward of the committed text."""
    monkeypatch.setattr(target_module, "COMPACT_HOLE_FRACTION", 0.1)  # holes approach 1/4 of the cache
    calls = []
    compact = TargetRunner.compact
    monkeypatch.setattr(TargetRunner, "compact", lambda self: calls.append(1) or compact(self))
    torch.manual_seed(0)
    runner = TargetRunner(embedded_target, 2)
    a, b = prompts[3], prompts[5]
    width = max(len(a), len(b))
    tokens = torch.tensor([[0] * (width - len(a)) + a, [0] * (width - len(b)) + b])
    valid = tokens.new_ones(tokens.shape, dtype=torch.bool)
    valid[0, : width - len(a)] = False
    valid[1, : width - len(b)] = False
    runner.forward(tokens, valid)
    runner.commit(valid)
    committed = [list(a), list(b)]
    for _ in range(6):
        new = torch.randint(5, 4000, (2, 4))
        step = runner.forward(new, torch.ones(2, 4, dtype=torch.bool))
        for row, text in enumerate(committed):
            reference = embedded_target(torch.tensor([text + new[row].tolist()])).logits[0, -4:]
            torch.testing.assert_close(step.logits[row], reference, atol=2e-4, rtol=1e-4)
        kept = torch.tensor([[True, False, False, False], [True, True, False, False]])
        runner.commit(kept)
        committed[0].append(int(new[0, 0]))
        committed[1] += new[1, :2].tolist()
    assert len(calls) >= 2, "row 0's holes should have triggered compactions"
    assert runner.lengths.tolist() == [len(committed[0]), len(committed[1])]
    assert runner.valid.sum(dim=1).tolist() == runner.lengths.tolist()


def test_trailing_holes_are_cropped_so_batch_one_keeps_no_hole(embedded_target, prompts):
    runner = TargetRunner(embedded_target, 1)
    prompt = torch.tensor([prompts[2]])
    runner.forward(prompt, torch.ones_like(prompt, dtype=torch.bool))
    runner.commit(torch.ones_like(prompt, dtype=torch.bool))
    runner.forward(torch.tensor([[7, 8, 9]]), torch.ones(1, 3, dtype=torch.bool))
    runner.commit(torch.tensor([[True, True, False]]))
    assert runner.valid.all() and runner.cache.get_seq_length() == prompt.shape[1] + 2


def test_a_prefill_may_keep_the_last_logits_only(embedded_target, prompts):
    """last_logits_only: the last slot's logits, and the same cache and features as a full prefill."""
    a, b = prompts[1], prompts[4]
    width = max(len(a), len(b))
    tokens = torch.tensor([[0] * (width - len(a)) + a, [0] * (width - len(b)) + b])
    valid = torch.tensor([[False] * (width - len(a)) + [True] * len(a), [False] * (width - len(b)) + [True] * len(b)])
    with LayerTap(embedded_target, (1,)) as tap:
        full, last = TargetRunner(embedded_target, 2, tap), TargetRunner(embedded_target, 2, tap)
        full_step, last_step = full.forward(tokens, valid), last.forward(tokens, valid, last_logits_only=True)
    assert last_step.logits.shape == (2, 1, full_step.logits.shape[-1])
    torch.testing.assert_close(last_step.logits[:, 0], full_step.logits[:, -1])
    torch.testing.assert_close(last_step.features, full_step.features)
    for mine, theirs in zip(last.cache.layers, full.cache.layers):
        torch.testing.assert_close(mine.keys, theirs.keys)


def test_a_runner_returns_the_features_a_full_capture_computes(embedded_target, prompts):
    """Prefill then one decode forward, tapped: the features of a full-sequence capture of the same tokens."""
    ids = prompts[2] + [5]
    with LayerTap(embedded_target, (0, 2)) as tap:
        runner = TargetRunner(embedded_target, 1, tap)
        prefill = runner.forward(torch.tensor([ids[:-1]]), torch.ones(1, len(ids) - 1, dtype=torch.bool))
        runner.commit(torch.ones(1, len(ids) - 1, dtype=torch.bool))
        step = runner.forward(torch.tensor([ids[-1:]]), torch.ones(1, 1, dtype=torch.bool))
    full = capture_target_features(embedded_target, torch.tensor([ids]), (0, 2)).hidden
    torch.testing.assert_close(torch.cat([prefill.features, step.features], dim=1), full, atol=1e-5, rtol=1e-4)


def test_generate_removes_its_layer_hooks_even_when_a_round_fails(embedded_target, embedded_drafters, prompts):
    """The tap is installed for one generate call: no hook outlives it, also when the drafter raises midway."""
    layers = decoder_layers(embedded_target)
    drafter = embedded_drafters["dspark"]
    decoder = SpeculativeDecoder(embedded_target, drafter, drafting="always")
    decoder.generate(prompts[:2], GenerationConfig(max_new_tokens=6))
    assert not any(layer._forward_hooks for layer in layers)

    def failing_propose(*args, **kwargs):
        assert any(layer._forward_hooks for layer in layers)  # installed while decoding
        raise RuntimeError("drafter fault")
    faulty_decoder = SpeculativeDecoder(embedded_target, drafter, drafting="always")
    faulty_decoder.draft = failing_propose
    with pytest.raises(RuntimeError, match="drafter fault"):
        faulty_decoder.generate(prompts[:2], GenerationConfig(max_new_tokens=6))
    assert not any(layer._forward_hooks for layer in layers)
