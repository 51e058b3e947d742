"""The tests that need a `dspark serve` unlike the shared ones, on one of its own: API keys, a drafter that misbehaves in
the two ways a test can arrange, and last the drain that ends it.

- `--api-key-file` twice (two keys, as while rotating): the OpenAI-compatible API answers either key and refuses a
  missing or wrong one with 401, counted on /metrics; probes, metrics and the admin API (SGLang's admin key) stay as
  they were; no key is on a command line. Every other request here carries a key.
- A draft vocabulary that leaves out every token the target answers VOCAB_PROMPTS with: no draft can be accepted,
  so every round commits the target's one token (integration/draft_vocab_mask.py) and the answers stay the target's.
- The test-only fault switch (integration/draft_faults.py): every 3rd draft step raises. Under load no request is
  lost and no answer altered: each failed step is retried, logged and counted in dspark_draft_faults_total.
- Last, graceful drain: SIGTERM during load (what Kubernetes sends on every rollout). Four greedy requests are in
  flight when `dspark serve` gets it; each completes with the target's own answer, a request sent after the signal
  is refused with 503 and a reason, as is one to every other route that starts model work (the request gate's route
  table), and the server exits 0 within the drain timeout.
"""
from __future__ import annotations

import json
import shutil
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch

from dspark.integration.draft_faults import FAULT_ENV
from dspark.models.drafters.draft_vocab import save_draft_vocab

from tests.integration.dspark_serve import DsparkServe, target_greedy_answers
from tests.integration.hf_reference import hf_greedy
from tests.integration.http_fuzz import VALID
from tests.paths import EMBEDDED, EMBEDDED_TARGET

pytestmark = pytest.mark.slow

VOCAB_SIZE = 4096  # embedded/target's
VOCAB_PROMPTS = ["def __init__(self", "import os\nimport sys\n\n\ndef main(", "for i in range("]
FAULT_PROMPTS = ["def add(a, b):", "import os\n", "class Queue:\n    ", "while True:\n    ", "def main():\n    ",
                 "x = [i for i in ", "from typing import ", "with open(path) as f:\n    "]
MAX_NEW_TOKENS, FAULT_REPEATS = 24, 2
DRAIN_PROMPTS = ["def fibonacci(n):", "class Stack:\n    ", "import json\n\n\ndef load(", "for key, value in "]
DRAIN_NEW_TOKENS = 192  # EOS ignored: several seconds of decoding however fast the machine, so SIGTERM lands mid-way
                        # (one round a token here: the draft vocabulary leaves out most of what these prompts answer)
DRAIN_TIMEOUT_S = 120
FAULTS = 'dspark_draft_faults_total{error="InjectedDraftFault"}'
KEYS = ("current-key-0123456789abcdef", "next-key-fedcba9876543210")
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    greedy = hf_greedy(EMBEDDED_TARGET, VOCAB_PROMPTS + FAULT_PROMPTS, MAX_NEW_TOKENS)
    return {prompt: ids for prompt, (ids, _) in greedy.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory, reference) -> DsparkServe:
    """The embedded DSpark drafter with a draft vocabulary of every token but VOCAB_PROMPTS' answers, failing every
    3rd draft step; the drain test (the module's last) ends it."""
    folder = tmp_path_factory.mktemp("misbehaving-drafter")
    drafter = folder / "drafter"
    shutil.copytree(EMBEDDED / "dspark", drafter)
    answered = {token for prompt in VOCAB_PROMPTS for token in reference[prompt]}
    save_draft_vocab(drafter, torch.tensor(sorted(set(range(VOCAB_SIZE)) - answered)),
                     source="the embedded vocabulary minus the target's answers", counted_tokens=0, coverage=0.0)
    keys = []
    for name, key in zip(("current", "next"), KEYS):
        (folder / name).write_text(key + "\n")
        keys += ["--api-key-file", str(folder / name)]
    replica = DsparkServe.alone(folder / "serve", drafter=drafter, env={FAULT_ENV: "3"},
                                dspark_args=("--drain-timeout", str(DRAIN_TIMEOUT_S), *keys))
    yield from replica.serving()


def status(url: str, path: str, key: str | None = None, body: dict | None = None,
           authorization: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None or authorization is not None:
        headers["Authorization"] = authorization or f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data, headers=headers), timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def refused(server: DsparkServe, reason: str) -> float:
    return server.metric(f'dspark_api_key_refused_requests_total{{reason="{reason}"}}')


def test_either_key_is_accepted_and_a_missing_or_wrong_one_gets_401_counted(server):
    assert [status(server.url, "/v1/chat/completions", key, CHAT) for key in KEYS] == [200, 200]
    assert status(server.url, "/v1/models", KEYS[1]) == 200
    before = {reason: refused(server, reason) for reason in ("missing", "wrong")}
    assert status(server.url, "/v1/chat/completions", None, CHAT) == 401
    assert status(server.url, "/v1/models") == 401
    assert status(server.url, "/v1/chat/completions", KEYS[0][:-1], CHAT) == 401  # a prefix of a key
    assert status(server.url, "/v1/chat/completions", KEYS[0] + "x", CHAT) == 401  # a key and more
    assert status(server.url, "/generate", None, {"text": "a"}, authorization=f"Basic {KEYS[0]}") == 401
    assert refused(server, "missing") - before["missing"] == 3  # no header, and a scheme other than Bearer
    assert refused(server, "wrong") - before["wrong"] == 2


def test_probes_metrics_and_the_admin_api_need_no_api_key(server):
    for path in ("/health", "/health_generate", "/liveness", "/metrics"):
        assert status(server.url, path) == 200, path
    client = server.client(server.reader_token)  # the sidecar reaches SGLang with SGLang's admin key
    try:
        assert client.serving()
    finally:
        client.close()


def test_no_process_has_a_key_on_its_command_line(server):
    processes = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
    command_lines = " ".join(" ".join(p.cmdline()) for p in processes)
    assert "sglang.launch_server" in command_lines
    assert not any(key in command_lines for key in KEYS)


def post(url: str, path: str, payload: dict, timeout_s: float) -> tuple[int, dict]:
    """POST with the first API key."""
    request = urllib.request.Request(url + path, data=json.dumps(payload).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {KEYS[0]}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {"body": err.read().decode(errors="replace"), "retry_after": err.headers.get("Retry-After")}


def greedy(url: str, text, max_new_tokens: int = MAX_NEW_TOKENS, ignore_eos: bool = False,
           timeout_s: float = 300) -> tuple[int, dict]:
    return post(url, "/generate", {"text": text, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": ignore_eos}}, timeout_s)


def test_a_draft_vocabulary_bounds_what_sglang_drafts(server, reference):
    status, responses = greedy(server.url, VOCAB_PROMPTS)
    assert status == 200, responses
    assert [r["output_ids"] for r in responses] == [reference[p] for p in VOCAB_PROMPTS]
    for response in responses:  # the first token comes from the prefill, then one per verify round
        assert response["meta_info"]["completion_tokens"] == response["meta_info"]["spec_verify_ct"] + 1


def test_failing_draft_steps_are_retried_and_counted_with_answers_unchanged(server, reference):
    faults_before = server.metric(FAULTS)
    with ThreadPoolExecutor(max_workers=len(FAULT_PROMPTS)) as pool:
        answers = list(pool.map(lambda p: greedy(server.url, p), FAULT_PROMPTS * FAULT_REPEATS))
    assert [status for status, _ in answers] == [200] * len(answers)
    assert [answer["output_ids"] for _, answer in answers] == [reference[p] for p in FAULT_PROMPTS * FAULT_REPEATS]
    assert server.metric(FAULTS) - faults_before >= 3
    assert "the draft step failed (InjectedDraftFault" in server.log.read_text()


def draining_within(url: str, timeout_s: float) -> bool:
    """Whether SGLang drains (GET /ready answers 503 from the SIGTERM on) within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/ready", timeout=5).close()
        except urllib.error.HTTPError as err:
            if err.code == 503:
                return True
        time.sleep(0.05)
    return False


def test_sigterm_finishes_requests_in_flight_refuses_new_ones_and_exits_zero(server):
    reference = target_greedy_answers(DRAIN_PROMPTS, DRAIN_NEW_TOKENS)
    with ThreadPoolExecutor(max_workers=len(DRAIN_PROMPTS)) as pool:
        in_flight = [pool.submit(greedy, server.url, prompt, DRAIN_NEW_TOKENS, True, DRAIN_TIMEOUT_S)
                     for prompt in DRAIN_PROMPTS]
        assert server.wait_for_in_flight(len(DRAIN_PROMPTS)), "the requests must be admitted before the SIGTERM"
        assert not any(f.done() for f in in_flight)
        server.process.send_signal(signal.SIGTERM)  # to `dspark serve` alone, as the kubelet does
        assert draining_within(server.url, DRAIN_TIMEOUT_S), "SGLang must take the SIGTERM `dspark serve` passes on"
        status, refused = greedy(server.url, "print(", DRAIN_NEW_TOKENS, True, DRAIN_TIMEOUT_S)
        every_route = {path: post(server.url, path, body, DRAIN_TIMEOUT_S)[0] for path, body in VALID.items()}
        still_running = not all(f.done() for f in in_flight)
        answers = [f.result() for f in in_flight]
    assert still_running, "the late request must arrive while the others are still in flight"
    assert status == 503 and "draining" in refused["body"] and refused["retry_after"] == "1"
    assert every_route == {path: 503 for path in VALID}
    assert [s for s, _ in answers] == [200] * len(DRAIN_PROMPTS)
    assert [a["output_ids"] for _, a in answers] == [reference[p] for p in DRAIN_PROMPTS]
    began = time.monotonic()
    assert server.process.wait(timeout=DRAIN_TIMEOUT_S) == 0
    print(f"exited 0, {time.monotonic() - began:.1f} s after the last answer")
