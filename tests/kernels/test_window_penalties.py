"""A verify window's penalties equal SGLang's own penalizers stepped through the same tokens one decode at a time
(frequency, presence, repetition, min_new_tokens, logit_bias), row by row: applied one by one in PENALTIES' order (a
non-overlapped decode with dspark's plugin) and from their accumulated buffers (an overlapped decode)."""
from types import SimpleNamespace

import pytest
import torch

from dspark.kernels.window_penalties import PENALTIES, WindowPenalties, apply_window_penalties, window_counts

VOCAB, WIDTH = 50, 6
EOS = 3


def request(frequency=0.0, presence=0.0, repetition=1.0, min_new_tokens=0, stop=()):
    params = SimpleNamespace(frequency_penalty=frequency, presence_penalty=presence, repetition_penalty=repetition,
                             min_new_tokens=min_new_tokens, stop_token_ids=set(stop))
    tokenizer = SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS)
    return SimpleNamespace(sampling_params=params, eos_token_ids={EOS}, tokenizer=tokenizer)


class OneRequestBatch:  # the orchestrator keeps a weak reference to its batch
    def __init__(self, req):
        self.reqs, self.device = [req], "cpu"


KIND = {"BatchedFrequencyPenalizer": "frequency", "BatchedPresencePenalizer": "presence",
        "BatchedRepetitionPenalizer": "repetition", "BatchedMinNewTokensPenalizer": "min_new_tokens"}


def orchestrator_of(req):
    from sglang.srt.sampling.penaltylib import (BatchedFrequencyPenalizer, BatchedMinNewTokensPenalizer,
                                                BatchedPenalizerOrchestrator, BatchedPresencePenalizer,
                                                BatchedRepetitionPenalizer)

    return BatchedPenalizerOrchestrator(VOCAB, OneRequestBatch(req), {
        BatchedFrequencyPenalizer, BatchedMinNewTokensPenalizer, BatchedPresencePenalizer,
        BatchedRepetitionPenalizer})


def sglang_rows(reqs, outputs, chains, logits, logit_bias, overlapped: bool):
    """Each row as SGLang's decode scores it: the orchestrator fed every committed token and the drafts before the
    row, one decode step at a time, then applied (overlapped: its accumulated buffers, additive then scaling)."""
    expected = logits.clone()
    for r, req in enumerate(reqs):
        orchestrator = orchestrator_of(req)
        for token in outputs[r]:
            orchestrator.cumulate_output_tokens(torch.tensor([token]))
        for j in range(WIDTH):
            if j:
                orchestrator.cumulate_output_tokens(chains[r, j:j + 1])
            row = expected[r, j:j + 1]
            if orchestrator.is_required and overlapped:
                additive = torch.zeros(1, VOCAB)
                orchestrator.accumulate_additive_penalties(additive)
                row.add_(additive)
                scaling = orchestrator.accumulate_scaling_penalties()
                if scaling is not None:
                    row.copy_(torch.where(row < 0, row * scaling, row / scaling))
            elif orchestrator.is_required:
                for penalizer in sorted(orchestrator.penalizers.values(), key=lambda p: PENALTIES.index(
                        KIND[type(p).__name__])):
                    if penalizer.is_multiplicative and penalizer.is_prepared():  # SGLang's scaling, eagerly
                        scaling = penalizer.get_scaling_penalties()
                        row.copy_(torch.where(row < 0, row * scaling, row / scaling))
                    else:
                        penalizer.apply(row)
            row.add_(logit_bias[r])
    return expected


def penalties_of(reqs, logit_bias):
    stop = torch.zeros(len(reqs), VOCAB, dtype=torch.bool)
    for r, req in enumerate(reqs):
        stop[r, list(req.sampling_params.stop_token_ids | req.eos_token_ids)] = True
    field = lambda name: torch.tensor([getattr(req.sampling_params, name) for req in reqs], dtype=torch.float32)
    return WindowPenalties(frequency=field("frequency_penalty"), presence=field("presence_penalty"),
                           repetition=field("repetition_penalty"),
                           min_new_tokens=torch.tensor([req.sampling_params.min_new_tokens for req in reqs]),
                           stop_tokens=stop, logit_bias=logit_bias)


@pytest.mark.parametrize("overlapped", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_every_row_equals_sglang_penalizers_stepped_one_token_at_a_time(seed, overlapped):
    generator = torch.Generator().manual_seed(seed)
    reqs = [request(frequency=0.5), request(presence=0.75), request(repetition=1.3),
            request(frequency=0.25, presence=0.5, repetition=1.2, min_new_tokens=7, stop=(5,)),
            request(frequency=0.4, presence=0.3, repetition=1.1), request(min_new_tokens=4), request()]
    # small token range: drafts repeat the history and one another, which is where rows differ
    outputs = [torch.randint(0, 12, (int(n),), generator=generator).tolist()
               for n in torch.randint(0, 9, (len(reqs),), generator=generator)]
    chains = torch.randint(0, 12, (len(reqs), WIDTH), generator=generator)
    logits = torch.randn(len(reqs), WIDTH, VOCAB, generator=generator) * 3
    logit_bias = torch.randn(len(reqs), VOCAB, generator=generator)
    expected = sglang_rows(reqs, outputs, chains, logits, logit_bias, overlapped)

    history = torch.stack([torch.bincount(torch.tensor(o, dtype=torch.long), minlength=VOCAB).float()
                           for o in outputs])
    actual = logits.clone()
    apply_window_penalties(actual, history, chains[:, 1:], torch.tensor([len(o) for o in outputs]),
                           penalties_of(reqs, logit_bias))
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


def test_repetition_scales_what_the_additive_penalties_left():
    history = torch.zeros(1, VOCAB)
    history[0, 7] = 2
    logits = torch.full((1, WIDTH, VOCAB), 2.0)
    apply_window_penalties(logits, history, torch.zeros(1, WIDTH - 1, dtype=torch.long), torch.tensor([2]),
                           penalties_of([request(frequency=0.4, presence=0.3, repetition=1.1)], None))
    assert logits[0, 0, 7].item() == pytest.approx((2 - 0.8 - 0.3) / 1.1)  # not (2 - 0.8) / 1.1 - 0.3


def test_a_token_drafted_earlier_in_the_window_is_penalised_in_later_rows_only():
    history = torch.zeros(1, VOCAB)
    drafts = torch.tensor([[7, 7, 9, 1, 2]])
    counts = window_counts(history, drafts)
    assert counts[0, :, 7].tolist() == [0, 1, 2, 2, 2, 2]
    assert counts[0, :, 9].tolist() == [0, 0, 0, 1, 1, 1]


def test_min_new_tokens_holds_stop_tokens_back_until_its_position():
    reqs = [request(min_new_tokens=5)]
    logits = torch.zeros(1, WIDTH, VOCAB)
    apply_window_penalties(logits, torch.zeros(1, VOCAB), torch.zeros(1, WIDTH - 1, dtype=torch.long),
                           torch.tensor([3]), penalties_of(reqs, None))
    # rows score output positions 3..8: EOS is held back at 3 and 4 only
    assert logits[0, :, EOS].tolist() == [float("-inf")] * 2 + [0.0] * 4


def test_a_window_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        apply_window_penalties(torch.zeros(2, WIDTH, VOCAB), torch.zeros(2, VOCAB),
                               torch.zeros(2, WIDTH, dtype=torch.long), torch.tensor([0, 0]),
                               penalties_of([request(), request()], None))
