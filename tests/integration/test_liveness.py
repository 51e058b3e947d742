"""GET /liveness sees a hung engine (issue 43, item 2) in seconds and `dspark serve` restarts it itself (issue 61,
item 4), and a default `dspark serve` serves dspark's metrics (issue 43, item 3), on one real `dspark serve` of the
embedded target on CPU with a small liveness window and step bound. The restart test comes last: it kills SGLang.

SGLang's /health answers without generating, as the chart runs it (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false):
it keeps answering 200 whatever the scheduler does, which is why liveness needs the plugin's endpoint."""
from __future__ import annotations

import http.client
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

from dspark.integration.liveness import BEAT_EVERY_S, Heartbeat, Liveness, problems, read_beats
from tests.integration.dspark_serve import DsparkServe
from tests.integration.exposition import scrape

WINDOW_S = 5.0
STEP_BOUND_S = 15.0  # a pass of the loop on two cores shared with other test runs took 7 s at worst
PROBE_EVERY_S = 0.25
RUNNING = 8  # DsparkServe's --max-running-requests
CLIENTS, TOKENS = RUNNING + 4, 128  # a full batch with 4 more waiting, each client asking again until LOAD_S passed
LOAD_S = 3 * WINDOW_S  # well over the window, however fast this machine generates


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    replica = DsparkServe.alone(tmp_path_factory.mktemp("liveness"),
                                dspark_args=("--liveness-window", str(WINDOW_S), "--liveness-step-bound",
                                             str(STEP_BOUND_S)),
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
    print(f"longest pass of the scheduler's loop so far: {probe(server.url)[1]['longest_step_s']} s")


def generate_retrying(url: str, max_new_tokens: int, failures: list) -> dict:
    """generate(), tried again while SGLang is killed and started again (a refused or cut connection, a 5xx), as
    a client behind a Service would; each failed try noted in `failures`."""
    while True:
        try:
            return generate(url, max_new_tokens)
        except urllib.error.HTTPError as err:
            if err.code < 500:
                raise
            failures.append(err.code)
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as err:
            failures.append(type(getattr(err, "reason", err)).__name__)
        time.sleep(1.0)


def restarts_counted(server: DsparkServe):
    """dspark_sglang_restarts on the replica's /metrics; None while no SGLang answers (killed, starting again)."""
    try:
        return server.metric("dspark_sglang_restarts")
    except (OSError, http.client.HTTPException):
        return None


def test_a_stopped_scheduler_fails_liveness_and_dspark_serve_restarts_sglang_itself_losing_no_request(server):
    """A scheduler that never finishes its step (SIGSTOP here; the stop_regex stall of issue 61 looked the same from
    outside: no pass of the loop) fails the step bound while /health keeps answering 200, and `dspark serve` kills
    and restarts SGLang itself (no kubelet here), counting it. Stopped while idle, so that its last heartbeat holds
    no work and only the step bound can judge it (with work, the shorter window here would judge first); the
    clients' requests then meet the stopped scheduler and are answered after the restart."""
    scheduler = scheduler_process(server)
    stop, answers, failures = threading.Event(), [], []

    def steady_load() -> None:
        while not stop.is_set():
            answers.append(len(generate_retrying(server.url, 64, failures)["output_ids"]))

    time.sleep(2 * BEAT_EVERY_S)  # idle: its latest heartbeat says so
    assert probe(server.url)[0] == 200 and server.metric("dspark_sglang_restarts") == 0
    os.kill(scheduler.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    health = probe(server.url, "/health")[0]  # seconds before the step bound: SGLang itself sees nothing wrong
    with ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(steady_load) for _ in range(4)]
        killed = None
        while restarts_counted(server) != 1:
            assert server.process.poll() is None and time.monotonic() - stopped < 900, server.log.read_text()[-3000:]
            if killed is None and not psutil.pid_exists(scheduler.pid):
                killed = time.monotonic() - stopped
            time.sleep(PROBE_EVERY_S)
        back = time.monotonic() - stopped
        assert probe_until(server.url, 200, time.monotonic() + 60)[0] == 200, "the restarted SGLang is alive"
        stop.set()
        for client in clients:
            client.result()
    assert health == 200
    log = server.log.read_text()
    killing = [line for line in log.splitlines() if "SGLang failed its liveness check" in line]
    assert killing == [f"dspark serve: SGLang failed its liveness check (scheduler {scheduler.pid} has not run its "
                       f"loop for {killing[0].split('loop for ')[1].split(' s ')[0]} s (liveness_step_bound "
                       f"{STEP_BOUND_S:g} s)); killing it"], log[-3000:]
    assert failures, "no request met the restart: the load did not span it"
    assert answers and set(answers) == {64}
    print(f"stopped scheduler: killed {killed and round(killed, 1)} s and serving again {back:.1f} s after SIGSTOP "
          f"(step bound {STEP_BOUND_S:g} s); {len(answers)} answers, {len(failures)} tries refused meanwhile; "
          f"{killing[0]}")


def test_work_that_makes_no_progress_for_the_window_is_hung_and_idle_time_is_not(tmp_path):
    heartbeat = Heartbeat(tmp_path)
    liveness = Liveness(liveness_window=60.0, liveness_step_bound=30.0)
    heartbeat.write(forwards=10, queued=0, now=100.0)  # idle: progress, whatever the forward count
    heartbeat.write(forwards=10, queued=3, now=150.0)  # work came; no forward yet
    (beat,) = read_beats(tmp_path)
    assert beat["progress"] == 100.0 and beat["beat"] == 150.0
    assert problems([beat], liveness, now=155.0) == []
    assert problems([beat], liveness, now=161.0) == [
        f"scheduler {os.getpid()} has 3 requests and has run no forward for 61 s (liveness_window 60 s)"]
    heartbeat.write(forwards=11, queued=3, now=161.0)  # a forward ran: progress again
    assert problems(read_beats(tmp_path), liveness, now=162.0) == []


def test_one_step_longer_than_the_step_bound_is_hung_and_an_admin_request_gets_the_window(tmp_path):
    heartbeat = Heartbeat(tmp_path)
    liveness = Liveness(liveness_window=300.0, liveness_step_bound=30.0)
    heartbeat.write(forwards=5, queued=2, now=100.0)
    assert problems(read_beats(tmp_path), liveness, now=129.0) == []
    assert problems(read_beats(tmp_path), liveness, now=131.0) == [
        f"scheduler {os.getpid()} has not run its loop for 31 s (liveness_step_bound 30 s)"]
    heartbeat.write(forwards=5, queued=2, now=131.0, control=True)  # a weight reload starts: the window applies
    assert problems(read_beats(tmp_path), liveness, now=400.0) == []
    assert problems(read_beats(tmp_path), liveness, now=432.0) == [
        f"scheduler {os.getpid()} has been in one admin request for 301 s (liveness_window 300 s)"]
    heartbeat.write(forwards=6, queued=2, now=432.0)  # back in the loop: the step bound again
    assert problems(read_beats(tmp_path), liveness, now=463.0)[0].endswith("(liveness_step_bound 30 s)")


def test_the_heartbeat_reports_the_longest_pass_of_the_loop(tmp_path):
    heartbeat = Heartbeat(tmp_path)
    for now in (10.0, 10.5, 13.0, 13.1):
        heartbeat.passed_at(now)
    heartbeat.write(forwards=1, queued=0, now=13.1)
    assert read_beats(tmp_path)[0]["longest_step"] == 2.5
