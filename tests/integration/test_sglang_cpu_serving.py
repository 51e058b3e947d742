"""The real SGLang 0.5.23 server serves the embedded target on CPU, and agrees with transformers.

Reads the session's shared `nospec_server` (tests/integration/conftest.py: `dspark serve --no-spec`, which runs
`python -m sglang.launch_server` with the CPU recipe) on the committed embedded target and checks that greedy
`/v1/completions` and `/generate` output equals transformers' greedy `generate()` token for token.
"""
from __future__ import annotations

import pytest

from tests.integration.hf_reference import hf_greedy as hf_greedy_outputs
from tests.paths import EMBEDDED_TARGET

PROMPTS = [
    "def __init__(self",
    "import os\nimport sys\n\n\ndef main(",
    "class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def put(self, item):\n        ",
]
MAX_NEW_TOKENS = 24

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(nospec_server):
    return nospec_server


@pytest.fixture(scope="module")
def hf_greedy():
    return hf_greedy_outputs(EMBEDDED_TARGET, PROMPTS, MAX_NEW_TOKENS)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_v1_completions_greedy_equals_transformers(server, hf_greedy, prompt):
    response = server.post("/v1/completions", {"model": str(EMBEDDED_TARGET), "prompt": prompt,
                                                "max_tokens": MAX_NEW_TOKENS, "temperature": 0})
    assert response["choices"][0]["text"] == hf_greedy[prompt][1]


def test_generate_batch_token_ids_equal_transformers(server, hf_greedy):
    response = server.post("/generate", {"text": PROMPTS, "sampling_params": {
        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}})
    assert [item["output_ids"] for item in response] == [hf_greedy[p][0] for p in PROMPTS]
    assert all(len(ids) > 0 for ids, _ in hf_greedy.values())
