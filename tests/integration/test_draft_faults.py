"""A drafter that fails under load (the test-only switch: every 3rd draft step raises) loses no request and
alters no answer: each failed step is retried, logged and counted in dspark_draft_faults_total."""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from dspark.integration.draft_faults import FAULT_ENV
from tests.integration.dspark_serve import DsparkServe
from tests.integration.hf_reference import hf_greedy
from tests.paths import EMBEDDED_TARGET

PROMPTS = ["def add(a, b):", "import os\n", "class Queue:\n    ", "while True:\n    ", "def main():\n    ",
           "x = [i for i in ", "from typing import ", "with open(path) as f:\n    "]
MAX_NEW_TOKENS = 24
REPEATS = 2


def generate(url: str, prompt: str) -> list[int]:
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}})
    request = urllib.request.Request(url + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["output_ids"]


def test_failing_draft_steps_are_retried_and_counted_with_answers_unchanged(tmp_path):
    reference = {p: ids for p, (ids, _) in hf_greedy(EMBEDDED_TARGET, PROMPTS, MAX_NEW_TOKENS).items()}
    server = DsparkServe.alone(tmp_path)
    server.env[FAULT_ENV] = "3"
    server.start()
    try:
        server.wait_ready()
        with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
            answers = list(pool.map(lambda p: generate(server.url, p), PROMPTS * REPEATS))
        assert answers == [reference[p] for p in PROMPTS * REPEATS]
        assert server.metric('dspark_draft_faults_total{error="InjectedDraftFault"}') >= 3
        assert "the draft step failed (InjectedDraftFault" in server.log.read_text()
    finally:
        server.stop()
