"""Fixtures shared by the whole suite: a tiny random Qwen3 target (never the committed embedded weights).

Without a GPU, dspark's Triton kernels (dspark.kernels.jit) are built by Triton's interpreter so that
tests/kernels can run them on CPU tensors against their references. Triton decides at decoration time, for
its own standard library too, and checks that later imports agree, so TRITON_INTERPRET=1 is set for the whole
session before anything imports Triton (transformers does). The SGLang servers of tests/integration are
started without it (tests/integration/conftest.py). With a GPU the kernels are compiled and tests/kernels runs
them on CUDA tensors.
"""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from tests.paths import REPO  # noqa: E402
from tests.server_starts import STARTS_ENV, server_starts  # noqa: E402

TINY_TARGET_CONFIG = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, intermediate_size=64, tie_word_embeddings=True,
                          eos_token_id=0, pad_token_id=0)


@pytest.fixture(scope="session")
def tiny_target() -> Qwen3ForCausalLM:
    """A 4-layer random Qwen3ForCausalLM (vocab 64, hidden 32, 4 heads / 2 KV heads); config at .config."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**TINY_TARGET_CONFIG)).eval()


def pytest_collection_modifyitems(session, config, items):
    """The chart's tests run last: on a fresh machine `make test` builds their API server beside the rest of the run
    (Makefile), so by the time they start it is there, or they wait for it. Otherwise in collection order."""
    helm = REPO / "tests" / "helm"
    items.sort(key=lambda item: item.path.is_relative_to(helm))


def starts_file(config) -> Path:
    return config._tmp_path_factory.getbasetemp() / "sglang-server-starts"


def pytest_sessionstart(session):
    """Servers started by this run record themselves in a file of its basetemp (tests/server_starts.py)."""
    os.environ[STARTS_ENV] = str(starts_file(session.config))


@pytest.hookimpl(trylast=True)  # after --durations, next to the outcome line
def pytest_terminal_summary(terminalreporter, config):
    starts = server_starts(starts_file(config))
    kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(starts.items()))
    terminalreporter.write_line(f"SGLang server starts: {sum(starts.values())}" + (f" ({kinds})" if kinds else ""))
