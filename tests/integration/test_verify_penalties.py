"""SGLang's orchestrator, hooked by the plugin, applies penalties in one order whatever order its dict iterates in
(two processes iterate it differently), and that order is the verify window's."""
import torch

from dspark.integration.verify_penalties import _apply_in_one_order
from dspark.kernels.window_penalties import WindowPenalties, apply_window_penalties

from tests.kernels.test_window_penalties import VOCAB, WIDTH, orchestrator_of, request


def test_every_dict_order_of_sglangs_penalizers_gives_the_window_row(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "disable", True)  # SGLang compiles its scaling; served eagerly on CPU
    from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator

    req = request(frequency=0.4, presence=0.3, repetition=1.1)
    history = [7, 7, 9]
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    counts = torch.bincount(torch.tensor(history), minlength=VOCAB).float()[None]
    expected = logits[:, None, :].repeat(1, WIDTH, 1)
    apply_window_penalties(expected, counts, torch.zeros(1, WIDTH - 1, dtype=torch.long), torch.tensor([3]),
                           WindowPenalties(frequency=torch.tensor([0.4]), presence=torch.tensor([0.3]),
                                           repetition=torch.tensor([1.1]), min_new_tokens=torch.tensor([0]),
                                           stop_tokens=torch.zeros(1, VOCAB, dtype=torch.bool)))
    rows = []
    for reverse in (False, True):
        orchestrator = orchestrator_of(req)
        for token in history:
            orchestrator.cumulate_output_tokens(torch.tensor([token]))
        orchestrator.penalizers = dict(reversed(orchestrator.penalizers.items())) if reverse \
            else orchestrator.penalizers
        row = logits.clone()
        _apply_in_one_order(BatchedPenalizerOrchestrator.apply, orchestrator, row)
        rows.append(row)
    torch.testing.assert_close(rows[0], rows[1], rtol=0, atol=0)
    torch.testing.assert_close(rows[0], expected[:, 0], rtol=1e-6, atol=1e-6)
