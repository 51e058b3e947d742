"""Where a dspark kernel op runs: the Triton kernel or its PyTorch reference.

`use_triton(tensor)` is the dispatch rule of every op with both (verification, Markov sampling, allocation):
the Triton kernel for CUDA tensors when Triton imports, the reference otherwise. CPU tensors take the
reference because compiled Triton has no CPU target; the `*_triton` functions still run on CPU tensors when
their kernels were built by Triton's interpreter (TRITON_INTERPRET=1 before the kernel module was first
imported), which is how CI tests them against the references.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from types import ModuleType

import torch


@lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and triton_available()


def load(module: str, tensor: torch.Tensor) -> ModuleType:
    """dspark.kernels.jit.<module>, checked to be able to run on tensor's device."""
    if not triton_available():
        raise RuntimeError(f"dspark.kernels.jit.{module} needs Triton, which does not import here; "
                           "use the *_torch reference")
    kernels = importlib.import_module(f"dspark.kernels.jit.{module}")
    if not tensor.is_cuda and not interpreted(kernels):
        raise RuntimeError(
            f"the Triton kernels of dspark.kernels.jit.{module} were compiled for a GPU and got {tensor.device} "
            "tensors: run them on CUDA, or set TRITON_INTERPRET=1 before they are first imported (tests)")
    return kernels


def interpreted(kernels: ModuleType) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return any(isinstance(value, InterpretedFunction) for value in vars(kernels).values())


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= max(n, 1): Triton block shapes are powers of 2."""
    return 1 << (max(n, 1) - 1).bit_length()


def cdiv(n: int, block: int) -> int:
    return -(-n // block)


def vocab_block(vocab: int) -> int:
    """Vocabulary chunk a program loads at once (kernels loop over the rest)."""
    return min(MAX_VOCAB_BLOCK, next_power_of_2(vocab))


MAX_VOCAB_BLOCK = 4096
