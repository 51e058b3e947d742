"""Triton kernel bodies for dspark.kernels (imported lazily by the `*_triton` wrappers there).

Each module here holds only `@triton.jit` functions; the host wrappers (checks, allocation, RNG, launch) and
the PyTorch references they are tested against live beside each other in dspark.kernels.<op>. Importing these
modules needs Triton; nothing else in dspark.kernels does, so the package imports on machines without it.
Triton decides at import time whether a kernel is compiled (GPU) or interpreted (TRITON_INTERPRET=1, CPU
tensors); `dspark.kernels.triton_launch.load` checks that the choice fits the tensors.
"""
