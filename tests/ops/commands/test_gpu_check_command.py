"""dspark gpu-check: refuses a machine without CUDA by name, and its summary table shows every measurement."""
import subprocess
import sys

import pytest
import torch

from dspark.ops.harness.gpu_check import summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_cuda_it_says_so_and_exits_2():
    result = subprocess.run([sys.executable, "-m", "dspark.ops.cli", "gpu-check", "--no-serve"], capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert "gpu-check needs a CUDA device" in result.stderr


def test_summary_has_one_row_per_implementation_and_a_column_per_batch_size():
    report = {"device": "H200", "torch": "2.14.1",
              "correctness": {"passed": 40, "failed": 0, "skipped": 0, "summary": "40 passed"},
              "serve": {"identical": True, "tau": 2.1},
              "speed": [{"op": "verify sampled", "impl": "dspark triton", "bs": 1, "us": 31.0},
                        {"op": "verify sampled", "impl": "dspark triton", "bs": 8, "us": 45.4},
                        {"op": "verify sampled", "impl": "dspark torch", "bs": 1, "us": 402.0},
                        {"op": "verify sampled", "impl": "dspark torch", "bs": 8, "error": "RuntimeError: x"}]}
    table = summary(report).splitlines()
    assert "40 passed, 0 failed" in table[2] and "identical=True tau=2.1" in table[3]
    assert table[5] == "| op | implementation | bs=1 us | bs=8 us |"
    assert "| verify sampled | dspark triton | 31 | 45 |" in table
    assert "| verify sampled | dspark torch | 402 | error |" in table
