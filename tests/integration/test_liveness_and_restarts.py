"""One real `dspark serve` of the embedded target on CPU with a small liveness window and step bound, for the tests
that restart or kill its SGLang, in the order they need it (the last one ends it):

- GET /liveness sees a hung engine (issue 43, item 2) in seconds and `dspark serve` restarts it itself (issue 61,
  item 4), and a default `dspark serve` serves dspark's metrics (issue 43, item 3). SGLang's /health answers without
  generating, as the chart runs it (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false): it keeps answering 200 whatever
  the scheduler does, which is why liveness needs the plugin's endpoint.
- A replica restarted under load through the admin API (issue 17): four clients send greedy requests in a loop,
  retrying a refusal (503 while the replica drains) or a refused connection (while SGLang starts again), as a client
  behind a Kubernetes Service or a router would. Mid-load the Restart RPC drains and restarts SGLang. Every request
  must end answered with the target's own tokens, the live settings must survive the restart, and the supervisor and
  sidecar must stay the same processes.
- SGLang killed under load is started again by `dspark serve`, with the live settings, until it has crashed more
  often than --max-restarts allows (issue 41): the liveness kill above was the first crash, this one the second, and
  the third ends the replica.
"""
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

import grpc
import psutil
import pytest

from dspark.integration.liveness import BEAT_EVERY_S, Heartbeat, Liveness, problems, read_beats
from tests.integration.dspark_serve import DsparkServe, target_greedy_answers
from tests.integration.exposition import scrape

WINDOW_S = 5.0
STEP_BOUND_S = 15.0  # a pass of the loop on two cores shared with other test runs took 7 s at worst
PROBE_EVERY_S = 0.25
RUNNING = 8  # DsparkServe's --max-running-requests
MAX_RESTARTS = 2  # the liveness kill and the first crash below; the second crash ends the replica
CLIENTS, TOKENS = RUNNING + 4, 128  # a full batch with 4 more waiting, each client asking again until LOAD_S passed
LOAD_S = 3 * WINDOW_S  # well over the window, however fast this machine generates


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    replica = DsparkServe.alone(tmp_path_factory.mktemp("liveness-and-restarts"),
                                dspark_args=("--liveness-window", str(WINDOW_S), "--liveness-step-bound",
                                             str(STEP_BOUND_S), "--max-restarts", str(MAX_RESTARTS)),
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


RESTART_PROMPTS = ["def fibonacci(n):", "class Stack:\n    ", "import json\n\n\ndef load(", "for key, value in ",
                   "# sort a list of numbers\n", "while True:\n    "]
RESTART_CLIENTS = 4
MAX_NEW_TOKENS = 64
RETRY_FOR_S = 600.0  # a retrying client gives up after this long: a request it gives up on is lost


def answer_retrying(url: str, prompt: str, retried: tuple[int, ...] = (503,)) -> tuple[list[int], list[str]]:
    """The answer's token ids, retrying as a client should (on the `retried` statuses and refused connections);
    and why each earlier try failed."""
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0,
                                                           "ignore_eos": True}}).encode()
    failures, deadline = [], time.monotonic() + RETRY_FOR_S
    while time.monotonic() < deadline:
        request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())["output_ids"], failures
        except urllib.error.HTTPError as err:
            if err.code not in retried:
                raise AssertionError(f"{prompt!r}: HTTP {err.code}: {err.read()[:300]!r}")
            failures.append(str(err.code))
            time.sleep(float(err.headers.get("Retry-After", "1")))
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as err:
            failures.append(type(getattr(err, "reason", err)).__name__)
            time.sleep(1.0)
    raise AssertionError(f"{prompt!r}: lost, no answer within {RETRY_FOR_S:g} s ({len(failures)} tries)")


@pytest.fixture(scope="module")
def restart_reference():
    return target_greedy_answers(RESTART_PROMPTS, MAX_NEW_TOKENS)


def test_restart_under_load_keeps_settings_and_loses_no_retried_request(server, restart_reference):
    admin, reader = server.client(server.admin_token), server.client(server.reader_token)
    with pytest.raises(grpc.RpcError) as refused:
        reader.restart(timeout_s=5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    admin.update({"max_verify_length": 3})
    assert admin.get().sps_table_source == "cached"  # the liveness restart found the table the first start measured
    sidecar_pids = {p.pid for p in children(server)}

    replies = []
    results = under_load(server, lambda: replies.append(admin.restart(timeout_s=500)), retried=(503,))
    reply, = replies

    assert reply.starts == 3 and reply.seconds > 0  # the first start, the liveness restart, this one
    assert reply.state.settings.max_verify_length == 3 and reply.state.settings.policy == "fixed"
    assert admin.get().settings.max_verify_length == 3
    assert admin.get().sps_table_source == "cached"  # the restart found the table instead of measuring again
    wrong = [(p, a) for p, a, _, _ in results if a != restart_reference[p]]
    assert not wrong, f"{len(wrong)} of {len(results)} answers differ from the target's: {wrong[:2]}"
    retried = [f for _, _, f, _ in results if f]
    assert retried, "no request met the restart: the load did not span it"
    assert server.process.poll() is None, "dspark serve itself must keep running"
    assert {p.pid for p in children(server)} & sidecar_pids, "the admin sidecar must not be restarted"
    assert server.metric("dspark_sglang_restarts") == 1, "a planned restart is not a crash (the liveness kill is)"
    audit = [json.loads(line) for line in server.audit_log.read_text().splitlines()]
    assert [a["result"] for a in audit if a["rpc"] == "Restart"] == ["permission_denied", "restarted"]
    print(f"{len(results)} requests answered identically, {len(retried)} retried "
          f"({sum(len(f) for f in retried)} tries refused); restart took {reply.seconds:.1f} s")


def test_sglang_killed_under_load_is_started_again_with_the_live_settings_until_it_crashes_too_often(
        server, restart_reference):
    admin = server.client(server.admin_token)
    wait_until(admin.serving, "SGLang serving its DSpark state")
    admin.update({"max_verify_length": 2})
    results = under_load(server, lambda: kill_scheduler(server), retried=(500, 502, 503))
    wrong = [(p, a) for p, a, _, _ in results if a != restart_reference[p]]
    assert not wrong, f"{len(wrong)} of {len(results)} answers differ from the target's: {wrong[:2]}"
    assert any(failures for _, _, failures, _ in results), "no request met the crash: the load did not span it"
    wait_until(admin.serving, "the restarted SGLang serving its DSpark state")
    assert admin.get().settings.max_verify_length == 2, "the live settings survive the crash"
    assert answer_retrying(server.url, RESTART_PROMPTS[0])[0] == restart_reference[RESTART_PROMPTS[0]]
    assert server.metric("dspark_sglang_restarts") == 2
    assert server.process.poll() is None
    kill_scheduler(server)  # a third crash within the window: past --max-restarts 2
    assert server.process.wait(timeout=120) != 0, "a crash loop must end in a non-zero exit"
    assert "giving up" in server.log.read_text()


def under_load(server: DsparkServe, disrupt, retried: tuple[int, ...]) -> list[tuple[str, list[int], list[str], float]]:
    """Run `disrupt()` while RESTART_CLIENTS clients send requests back to back, so that some are always in flight;
    keep the load on until a request is answered after `disrupt()` returned. Each answer as
    (prompt, token ids, why earlier tries failed, when it was answered); a lost request raises."""
    stop, results = threading.Event(), []

    def client(number: int) -> None:
        sent = 0
        while not stop.is_set():
            prompt = RESTART_PROMPTS[(number + sent) % len(RESTART_PROMPTS)]
            answer, failures = answer_retrying(server.url, prompt, retried)
            results.append((prompt, answer, failures, time.monotonic()))
            sent += 1

    with ThreadPoolExecutor(max_workers=RESTART_CLIENTS) as pool:
        clients = [pool.submit(client, n) for n in range(RESTART_CLIENTS)]
        try:
            wait_until(lambda: results, "a first answer")  # load running, requests in flight
            disrupt()
            after = time.monotonic()
            wait_until(lambda: any(at > after for *_, at in results), "an answer after the disruption")
        finally:
            stop.set()
        for future in clients:
            future.result()
    return results


def kill_scheduler(server: DsparkServe) -> None:
    tree = psutil.Process(server.process.pid).children(recursive=True)
    schedulers = [p for p in tree if "sglang::scheduler" in " ".join(p.cmdline()) or p.name() == "sglang::scheduler"]
    assert schedulers, "no SGLang scheduler process found"
    for process in schedulers:
        process.kill()


def wait_until(condition, what: str, timeout_s: float = RETRY_FOR_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.2)


def children(server: DsparkServe) -> list[psutil.Process]:
    """The admin sidecar(s) of `dspark serve`."""
    return [p for p in psutil.Process(server.process.pid).children() if "admin-server" in " ".join(p.cmdline())]


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
