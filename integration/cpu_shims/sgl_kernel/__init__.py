"""CPU stand-in for `sgl_kernel`, SGLang's CUDA kernel package (PyPI `sglang-kernel`).

SGLang 0.5.23 imports `sgl_kernel` at module import time even on CPU (`SGLANG_USE_CPU_ENGINE=1`), but
PyPI ships only CUDA builds of it and the CPU build needs source and AMX hardware we do not have.
On a CPU without AMX every layer SGLang runs for plain serving takes its `forward_native` path, so no
op of this package is called; the names only have to resolve at import.

This shim is put on `sys.path` *after* site-packages by the environment set-up (a `.pth` file), so a
real `sgl_kernel` installed on a GPU machine always wins. Every op it is asked to *run* that it has no
working implementation for raises `NotImplementedError` naming the op, never a silent wrong result.
"""
from __future__ import annotations

IS_DSPARK_CPU_SHIM = True


def _missing_op(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this process runs dspark's CPU stand-in for SGLang's "
            f"CUDA kernel package, which has no CPU implementation of '{name}'. Run on a GPU machine "
            f"with sglang-kernel installed, or choose an SGLang code path that does not need this op."
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str):
    # Dunder lookups (e.g. __path__, __version__) must fail normally so importlib and
    # version probes see a plain module, not a callable.
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing_op(name)
