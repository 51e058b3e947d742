"""A replica restarted under load through the admin API (issue 17): no request a retrying client sends is lost;
and SGLang killed under load is started again by `dspark serve`, with the live settings, until it has crashed
more often than --max-restarts allows (issue 41).

`dspark serve` of the embedded target with DSpark and its admin sidecar; four clients send greedy requests
in a loop, retrying a refusal (503 while the replica drains) or a refused connection (while SGLang starts
again), as a client behind a Kubernetes Service or a router would. Mid-load the Restart RPC drains and
restarts SGLang. Every request must end answered with the target's own tokens, the live settings must
survive the restart, and the supervisor and sidecar must stay the same processes. One replica (--max-restarts 1)
takes the planned restart, then the crashes, so the suite starts one server for both."""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import psutil
import pytest

from tests.integration.dspark_serve import DsparkServe, target_greedy_answers

PROMPTS = ["def fibonacci(n):", "class Stack:\n    ", "import json\n\n\ndef load(", "for key, value in ",
           "# sort a list of numbers\n", "while True:\n    "]
CLIENTS = 4
MAX_NEW_TOKENS = 64
RETRY_FOR_S = 600.0  # a retrying client gives up after this long: a request it gives up on is lost


def generate(url: str, prompt: str, retried: tuple[int, ...] = (503,)) -> tuple[list[int], list[str]]:
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
def reference():
    return target_greedy_answers(PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One replica for both tests, in file order: the Restart RPC first (a planned restart is not a crash, so it
    leaves --max-restarts 1 whole), then the crashes that end it."""
    replica = DsparkServe.alone(tmp_path_factory.mktemp("restart"))
    at = replica.command.index("--")
    replica.command[at:at] = ["--max-restarts", "1"]
    replica.start()
    try:
        replica.wait_ready()
        yield replica
    finally:
        replica.stop()


def test_restart_under_load_keeps_settings_and_loses_no_retried_request(server, reference):
    admin, reader = server.client(server.admin_token), server.client(server.reader_token)
    with pytest.raises(grpc.RpcError) as refused:
        reader.restart(timeout_s=5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    admin.update({"max_verify_length": 3})
    assert admin.get().sps_table_source == "sglang-forward"  # no table given: the schedulers measured one
    sidecar_pids = {p.pid for p in children(server)}

    replies = []
    results = under_load(server, lambda: replies.append(admin.restart(timeout_s=500)), retried=(503,))
    reply, = replies

    assert reply.starts == 2 and reply.seconds > 0
    assert reply.state.settings.max_verify_length == 3 and reply.state.settings.policy == "fixed"
    assert admin.get().settings.max_verify_length == 3
    assert admin.get().sps_table_source == "cached"  # the restart found the table instead of measuring again
    wrong = [(p, a) for p, a, _, _ in results if a != reference[p]]
    assert not wrong, f"{len(wrong)} of {len(results)} answers differ from the target's: {wrong[:2]}"
    retried = [f for _, _, f, _ in results if f]
    assert retried, "no request met the restart: the load did not span it"
    assert server.process.poll() is None, "dspark serve itself must keep running"
    assert {p.pid for p in children(server)} & sidecar_pids, "the admin sidecar must not be restarted"
    assert server.metric("dspark_sglang_restarts") == 0, "a planned restart is not a crash"
    audit = [json.loads(line) for line in server.audit_log.read_text().splitlines()]
    assert [a["result"] for a in audit if a["rpc"] == "Restart"] == ["permission_denied", "restarted"]
    print(f"{len(results)} requests answered identically, {len(retried)} retried "
          f"({sum(len(f) for f in retried)} tries refused); restart took {reply.seconds:.1f} s")


def test_sglang_killed_under_load_is_started_again_with_the_live_settings_until_it_crashes_too_often(
        server, reference):
    admin = server.client(server.admin_token)
    wait_until(admin.serving, "SGLang serving its DSpark state")
    admin.update({"max_verify_length": 2})
    results = under_load(server, lambda: kill_scheduler(server), retried=(500, 502, 503))
    wrong = [(p, a) for p, a, _, _ in results if a != reference[p]]
    assert not wrong, f"{len(wrong)} of {len(results)} answers differ from the target's: {wrong[:2]}"
    assert any(failures for _, _, failures, _ in results), "no request met the crash: the load did not span it"
    wait_until(admin.serving, "the restarted SGLang serving its DSpark state")
    assert admin.get().settings.max_verify_length == 2, "the live settings survive the crash"
    assert generate(server.url, PROMPTS[0])[0] == reference[PROMPTS[0]]
    assert server.metric("dspark_sglang_restarts") == 1
    assert server.process.poll() is None
    kill_scheduler(server)  # a second crash within the window: past --max-restarts 1
    assert server.process.wait(timeout=120) != 0, "a crash loop must end in a non-zero exit"
    assert "giving up" in server.log.read_text()


def under_load(server: DsparkServe, disrupt, retried: tuple[int, ...]) -> list[tuple[str, list[int], list[str], float]]:
    """Run `disrupt()` while CLIENTS clients send requests back to back, so that some are always in flight;
    keep the load on until a request is answered after `disrupt()` returned. Each answer as
    (prompt, token ids, why earlier tries failed, when it was answered); a lost request raises."""
    stop, results = threading.Event(), []

    def client(number: int) -> None:
        sent = 0
        while not stop.is_set():
            prompt = PROMPTS[(number + sent) % len(PROMPTS)]
            answer, failures = generate(server.url, prompt, retried)
            results.append((prompt, answer, failures, time.monotonic()))
            sent += 1

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        clients = [pool.submit(client, n) for n in range(CLIENTS)]
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
