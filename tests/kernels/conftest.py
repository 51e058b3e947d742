"""tests/kernels runs each Triton kernel against its PyTorch reference on the device there is: CUDA when a GPU
is present, else CPU tensors through Triton's interpreter (tests/conftest.py builds the kernels that way). A lent
GPU machine has no pytest: there `make gpu-check` runs the same comparisons (ops/harness/gpu_check/kernel_rows.py)."""
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE
