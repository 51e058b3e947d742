"""The committed embedded target and its three drafters, loaded once for the decoding tests."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.kernels.sps import SpsTable
from dspark.models.checkpoint import load_drafter
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from tests.paths import EMBEDDED, EMBEDDED_TARGET

KINDS = ("dspark", "dflash", "eagle3")
# A falling cost curve, so the confidence-aware policies verify some drafts and not others.
SPS = SpsTable.from_probes({1: 1.0, 4: 0.95, 8: 0.85, 16: 0.6, 32: 0.35, 64: 0.2, 1024: 0.15, 4096: 0.05}, 8192)
POLICIES = {  # name -> (policy, the most drafts it may verify)
    "fixed-2": (VerifyLengthPolicy.of("fixed", max_verify_length=2), 2),
    "mtp1": (VerifyLengthPolicy.of("mtp1"), 1),
    "threshold": (VerifyLengthPolicy.of("threshold", threshold=0.3), None),
    "threshold-min1": (VerifyLengthPolicy.of("threshold", threshold=0.9, min_verify_length=1), None),
    "causal": (VerifyLengthPolicy.of("causal", sps=SPS), None),
    "lagged": (VerifyLengthPolicy.of("lagged", sps=SPS), None),
}
# Prompts of different lengths (1 to ~40 tokens), so batches are ragged from the prefill on.
TEXTS = ("def", "import os\nimport sys\n\n", "class Foo(object):\n    def __init__(self, name):\n        self.",
         "    return x", "# Copyright 2001 Python Software Foundation\n\"\"\"Utilities for", "if __name__ == ",
         "for i in range(", "    def close(self):\n        \"\"\"Close the file.\"\"\"\n        ")


@pytest.fixture(scope="session")
def embedded_target():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def embedded_tokenizer():
    return AutoTokenizer.from_pretrained(EMBEDDED_TARGET)


@pytest.fixture(scope="session")
def embedded_drafters(embedded_target):
    return {kind: load_drafter(EMBEDDED / kind, target_model=embedded_target, dtype=torch.float32) for kind in KINDS}


@pytest.fixture(scope="session")
def prompts(embedded_tokenizer):
    return [embedded_tokenizer.encode(text) for text in TEXTS]
