"""TargetOutputs: the target's logits where a loss reads them."""
import torch

from dspark.models.training.tasks import TargetOutputs


def test_distinct_logits_computes_each_position_once_and_maps_every_read_to_it():
    last_hidden = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    head = torch.nn.Linear(3, 7, bias=False)
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    outputs = TargetOutputs(hidden=last_hidden, last_hidden=last_hidden, lm_head=head)
    positions = torch.tensor([[1, 2, 2, 3, 1], [0, 0, 4, 4, 4]])

    rows, row = outputs.distinct_logits(positions)

    assert calls == [5], "five distinct (sequence, position) pairs, each through the head once"
    expected = outputs.logits().gather(1, positions.unsqueeze(-1).expand(-1, -1, 7))
    assert torch.allclose(rows[row], expected, atol=1e-6)
