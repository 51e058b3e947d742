"""Fixtures for the training tests: a tiny random Qwen3 target and random token documents."""
import pytest
import torch
from training_helpers import TINY_VOCAB, build_tiny_target


@pytest.fixture(scope="module")
def peaked_target():
    # Tiny matmuls: one thread is several times faster than two on a shared, loaded 2-core machine.
    torch.set_num_threads(1)
    return build_tiny_target()


@pytest.fixture(scope="module")
def tiny_documents() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, TINY_VOCAB, (n,), generator=g) for n in (40, 90, 12, 60)]
