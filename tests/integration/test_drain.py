"""Graceful drain of the served stack: SIGTERM during load (what Kubernetes sends on every rollout).

`dspark serve` of the embedded target with DSpark; four greedy requests in flight when its process gets
SIGTERM. Every one of them must complete with the target's own answer, a request sent after the signal
must be refused with 503 and a reason, as must one to every other route that starts model work (the request gate's
route table), and the server must exit 0 within the drain timeout."""
from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.dspark_serve import DsparkServe, target_greedy_answers
from tests.integration.http_fuzz import VALID

PROMPTS = ["def fibonacci(n):", "class Stack:\n    ", "import json\n\n\ndef load(", "for key, value in "]
MAX_NEW_TOKENS = 480  # EOS ignored: several seconds of decoding however fast the machine, so SIGTERM lands mid-way
DRAIN_TIMEOUT_S = 120


def generate(url: str, prompt: str) -> tuple[int, dict]:
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0,
                                                           "ignore_eos": True}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=DRAIN_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {"body": err.read().decode(errors="replace"), "retry_after": err.headers.get("Retry-After")}


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


def post_status(url: str, payload: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=DRAIN_TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def reference():
    return target_greedy_answers(PROMPTS, MAX_NEW_TOKENS)


def test_sigterm_finishes_requests_in_flight_refuses_new_ones_and_exits_zero(tmp_path, reference):
    server = DsparkServe.alone(tmp_path)
    at = server.command.index("--")
    server.command[at:at] = ["--drain-timeout", str(DRAIN_TIMEOUT_S)]
    server.start()
    try:
        server.wait_ready()
        with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
            in_flight = [pool.submit(generate, server.url, prompt) for prompt in PROMPTS]
            assert server.wait_for_in_flight(len(PROMPTS)), "the requests must be admitted before the SIGTERM"
            assert not any(f.done() for f in in_flight)
            server.process.send_signal(signal.SIGTERM)  # to `dspark serve` alone, as the kubelet does
            assert draining_within(server.url, DRAIN_TIMEOUT_S), "SGLang must take the SIGTERM `dspark serve` passes on"
            status, refused = generate(server.url, "print(")
            every_route = {path: post_status(server.url + path, body) for path, body in VALID.items()}
            still_running = not all(f.done() for f in in_flight)
            answers = [f.result() for f in in_flight]
        assert still_running, "the late request must arrive while the others are still in flight"
        assert status == 503 and "draining" in refused["body"] and refused["retry_after"] == "1"
        assert every_route == {path: 503 for path in VALID}
        assert [s for s, _ in answers] == [200] * len(PROMPTS)
        assert [a["output_ids"] for _, a in answers] == [reference[p] for p in PROMPTS]
        began = time.monotonic()
        assert server.process.wait(timeout=DRAIN_TIMEOUT_S) == 0
        print(f"exited 0, {time.monotonic() - began:.1f} s after the last answer")
    finally:
        server.stop()
