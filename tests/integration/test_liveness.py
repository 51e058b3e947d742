"""GET /liveness sees a hung engine (issue 43, item 2), and a default `dspark serve` serves dspark's metrics
(item 3), on one real `dspark serve` of the embedded target on CPU with a small liveness window.

SGLang's /health answers without generating, as the chart runs it (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false):
it keeps answering 200 whatever the scheduler does, which is why liveness needs the plugin's endpoint."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from dspark.integration.liveness import BEAT_EVERY_S, Heartbeat, problems, read_beats
from tests.integration.dspark_serve import DsparkServe
from tests.integration.exposition import scrape

WINDOW_S = 5.0
PROBE_EVERY_S = 0.25
RUNNING = 8  # DsparkServe's --max-running-requests
CLIENTS, TOKENS = RUNNING + 4, 128  # a full batch with 4 more waiting, each client asking again until LOAD_S passed
LOAD_S = 3 * WINDOW_S  # well over the window, however fast this machine generates


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    replica = DsparkServe.alone(tmp_path_factory.mktemp("liveness"), dspark_args=("--liveness-window", str(WINDOW_S)),
                                env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}).start()
    replica.wait_ready()
    yield replica
    replica.stop()


def probe(url: str, path: str = "/liveness") -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + path, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def probe_until(url: str, wanted: int, deadline: float) -> tuple[int, dict]:
    """Probe /liveness until it answers `wanted` or `deadline` (time.monotonic()) passes; the last answer."""
    while True:
        answer = probe(url)
        if answer[0] == wanted or time.monotonic() > deadline:
            return answer
        time.sleep(PROBE_EVERY_S)


def generate(url: str, max_new_tokens: int) -> dict:
    body = json.dumps({"text": "def parse(text):", "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def scheduler_process(server: DsparkServe) -> psutil.Process:
    """SGLang's scheduler subprocess (it titles itself sglang::scheduler...)."""
    schedulers = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                  if "sglang::scheduler" in " ".join(p.cmdline())]
    assert len(schedulers) == 1, schedulers
    return schedulers[0]


def test_a_default_serve_lists_the_dspark_metric_families(server):
    generate(server.url, 16)
    families = {line.split()[2] for line in scrape(server.url).splitlines() if line.startswith("# TYPE dspark_")}
    assert {"dspark_rounds_total", "dspark_verify_length", "dspark_accepted_tokens_total", "dspark_state_version",
            "dspark_step_overhead_seconds", "dspark_gate_sub_requests_in_flight"} <= families, sorted(families)


def test_liveness_passes_while_idle_and_through_a_long_generation_at_full_load(server):
    assert probe(server.url)[0] == 200
    began = time.monotonic()

    def client() -> list:
        """Generations back to back until LOAD_S passed: the batch stays full the whole time."""
        lengths = []
        while time.monotonic() - began < LOAD_S:
            lengths.append(len(generate(server.url, TOKENS)["output_ids"]))
        return lengths

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers, seen = [pool.submit(client) for _ in range(CLIENTS)], []
        while not all(answer.done() for answer in answers):
            seen.append(probe(server.url)[0])
            time.sleep(PROBE_EVERY_S)
        lasted = time.monotonic() - began
    assert all(lengths and set(lengths) == {TOKENS} for lengths in (answer.result() for answer in answers))
    assert lasted > LOAD_S > 2 * WINDOW_S, "the load must outlast the window for this test to mean anything"
    assert set(seen) == {200}, seen


def test_a_stopped_scheduler_fails_liveness_within_the_window_while_health_answers_and_passes_once_resumed(server):
    scheduler = scheduler_process(server)
    stop, failures = threading.Event(), []

    def steady_load() -> None:
        while not stop.is_set():
            try:
                generate(server.url, 64)
            except Exception as err:  # noqa: BLE001  (a lost request fails the test below)
                failures.append(repr(err))

    with ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(steady_load) for _ in range(4)]
        time.sleep(2 * BEAT_EVERY_S)
        assert probe(server.url)[0] == 200
        os.kill(scheduler.pid, signal.SIGSTOP)
        try:
            # It fails once the heartbeat is older than the window: by window + one beat, plus a probe's slack
            code, answer = probe_until(server.url, 503, time.monotonic() + WINDOW_S + BEAT_EVERY_S + 2.0)
            health = probe(server.url, "/health")[0]
        finally:
            os.kill(scheduler.pid, signal.SIGCONT)
        assert code == 503 and f"scheduler {scheduler.pid} has not run its loop" in answer["problems"][0], answer
        assert health == 200  # SGLang's own check sees nothing wrong
        assert probe_until(server.url, 200, time.monotonic() + 30)[0] == 200, "no pass again after SIGCONT"
        stop.set()
        for client in clients:
            client.result()
    assert failures == []


def test_work_that_makes_no_progress_for_the_window_is_hung_and_idle_time_is_not(tmp_path):
    heartbeat = Heartbeat(tmp_path)
    heartbeat.write(forwards=10, queued=0, now=100.0)  # idle: progress, whatever the forward count
    heartbeat.write(forwards=10, queued=3, now=150.0)  # work came; no forward yet
    (beat,) = read_beats(tmp_path)
    assert beat["progress"] == 100.0 and beat["beat"] == 150.0
    assert problems([beat], window=60.0, now=155.0) == []
    assert problems([beat], window=60.0, now=161.0) == [
        f"scheduler {os.getpid()} has 3 requests and has run no forward for 61 s (liveness_window 60 s)"]
    heartbeat.write(forwards=11, queued=3, now=161.0)  # a forward ran: progress again
    assert problems(read_beats(tmp_path), window=60.0, now=162.0) == []
