"""TargetOutputs: the target's logits where a loss reads them."""
import torch

from dspark.models.training.tasks import TargetOutputs


def test_distinct_logits_computes_each_position_once_and_maps_every_read_to_it():
    last_hidden = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    head = torch.nn.Linear(3, 7, bias=False)
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    outputs = TargetOutputs(hidden=last_hidden, last_hidden=last_hidden, lm_head=head)
    positions = torch.tensor([[1, 2, 2, 3, 1], [5, 5, 9, 9, 9]])  # into the 2 x 5 positions, flattened

    rows, row = outputs.distinct_logits(positions)

    assert calls == [5], "five distinct positions, each through the head once"
    assert row.shape == positions.shape
    assert torch.allclose(rows[row], outputs.logits().flatten(0, 1)[positions], atol=1e-6)
