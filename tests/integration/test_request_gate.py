"""The request gate on the real server: `dspark serve` of the embedded target with DSpark, the plugin loaded (the
session's gate_limits_server, tests/integration/conftest.py).

The five requests that killed a replica before the gate each get a 4xx and the server keeps serving the same
greedy answers; oversized bodies get 413 before they are parsed, `n: 100000` and more sub-requests than the
replica takes get 400 / 429, a route the gate cannot bound gets 404, and 2,000 random malformed requests from
four clients leave it serving, with every answer 2xx or 4xx and its memory bounded. The route table test
fails when SGLang grows a route nobody has classed.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from dspark.integration.request_gate import ModelBounds, Refused, check_body, parse
from dspark.integration.request_limits import RequestLimits
from dspark.integration.routes import RouteClassifier, RouteKind
from dspark.integration.server import cpu_server_args

from tests.integration.dspark_serve import MAX_QUEUED_REQUESTS, DsparkServe, target_greedy_answers
from tests.integration.http_fuzz import VALID, fuzz_request
from tests.integration.sglang_resolve import resolve_launch
from tests.paths import EMBEDDED_TARGET

pytestmark = pytest.mark.slow

PROMPTS = ["def fibonacci(n):", "import json\n\n\ndef load("]
MAX_NEW_TOKENS = 16
MAX_QUEUED = MAX_QUEUED_REQUESTS
CRASHERS = [  # each of these killed the replica before the gate
    ("/v1/completions", {"model": "default", "prompt": "def f(", "max_tokens": 4, "logprobs": 1000000}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "logprobs": True, "top_logprobs": 1000000}),
    ("/generate", {"text": "def f(", "return_logprob": True, "top_logprobs_num": 1000000,
                   "sampling_params": {"max_new_tokens": 4}}),
    ("/generate", {"input_ids": [1000000], "sampling_params": {"max_new_tokens": 4}}),
    ("/generate", {"input_ids": [-1], "sampling_params": {"max_new_tokens": 4}}),
    ("/v1/completions", {"model": "default", "prompt": [1000000000], "max_tokens": 4}),
]
FUZZ_REQUESTS, FUZZ_CLIENTS = 2000, 4
REFUSED_429 = 'dspark_gate_refused_requests_total{field="max_queued_requests",status="429"}'
MEMORY_GROWTH_LIMIT = 512 << 20  # bytes the serving processes may grow by over the whole fuzz
WORKER = "dspark.integration.bounded_worker"


def post(url: str, body: bytes, content_type: str = "application/json", timeout_s: float = 120,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def post_json(url: str, payload) -> tuple[int, dict]:
    status, _, body = post(url, json.dumps(payload).encode())
    return status, json.loads(body) if body else {}


def greedy(url: str, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    status, answer = post_json(url + "/generate", {"text": prompt, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}})
    assert status == 200, answer
    return answer["output_ids"]


def serving_processes(server: DsparkServe, workers: bool) -> list:
    """The replica's processes: those that serve (workers=False), or the gate's bounded workers (bounded_worker.py:
    at most one per kind of work, each importing SGLang once, started at first use)."""
    root = psutil.Process(server.process.pid)
    found = []
    for process in [root, *root.children(recursive=True)]:
        try:
            if (WORKER in " ".join(process.cmdline())) == workers:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def serving_rss(server: DsparkServe) -> int:
    return sum(p.memory_info().rss for p in serving_processes(server, workers=False))


@pytest.fixture(scope="module")
def reference():
    return target_greedy_answers(PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def server(gate_limits_server):
    return gate_limits_server


# ------------------------------------------------------------------ the rules, without a server

BOUNDS = ModelBounds(vocab=4096, context=2048)


@pytest.mark.parametrize("body, field, status", [
    ({"prompt": "x", "logprobs": 21}, "logprobs", 400),
    ({"prompt": "x", "logprobs": "21"}, "logprobs", 400),  # pydantic would read the string as 21
    ({"sampling_params": [{"n": 2}, {"n": 17}], "text": ["a", "b"]}, "n", 400),
    ({"input_ids": [[1, 2], [3, 4096]]}, "input_ids", 400),
    ({"input_ids": [1.5]}, "input_ids", 400),
    ({"input_ids": ["4096"]}, "input_ids", 400),
    ({"input_ids": list(range(5)) * 500}, "input_ids", 400),  # 2,500 ids: longer than the context
    ({"logit_bias": {"99999": 5}}, "logit_bias", 400),
    ({"max_tokens": 2049}, "max_tokens", 400),
    ({"options": {"num_predict": -1}}, "options.num_predict", 400),
    ({"options": {"top_p": 8}}, "options.top_p", 400),  # SGLang's Ollama routes skip its own range check
    ({"options": {"seed": 1}}, "options.seed", 400),
    ({"top_k": 2 ** 63}, "top_k", 400),  # past int64: the scheduler could not build its batch
    ({"messages": []}, "messages", 400),
    ({"instances": [{"input_ids": [5000]}]}, "input_ids", 400),
    ({"text": ["a"] * 1025}, "max_queued_requests", 400),
    ({"text": ["a"] * 100, "n": 11}, "max_queued_requests", 400),
    ([1, 2], "body", 400),
])
def test_the_gate_refuses_out_of_range_values_naming_the_field(body, field, status):
    with pytest.raises(Refused) as refused:
        check_body(body, RequestLimits(), BOUNDS)
    assert (refused.value.field, refused.value.status) == (field, status)
    assert field in refused.value.message or "completions" in refused.value.message or "object" in refused.value.message


def test_a_refusal_naming_a_key_the_client_wrote_is_counted_under_a_fixed_label():
    fields = set()
    for key in ("a_key_of_my_own", "another_one", "top_k"):
        with pytest.raises(Refused) as refused:
            check_body({"text": "x", key: 2 ** 63}, RequestLimits(), BOUNDS)  # sampling_params takes known keys only
        assert refused.value.field == key and key in refused.value.message
        fields.add(refused.value.counted_as)
    assert fields == {"magnitude"}  # /metrics gets one label however many keys clients invent


@pytest.mark.parametrize("body, count", [
    ({"text": "def f(", "sampling_params": {"max_new_tokens": 16}}, 1),
    ({"prompt": [1, 2, 3], "logprobs": 20, "n": 4}, 4),  # a list of ids is one prompt
    ({"prompt": ["a", "b"], "best_of": 3}, 6),
    ({"messages": [{"role": "user", "content": "n"}], "tools": [{"parameters": {"n": 10 ** 9}}]}, 1),  # free-form
    ({"input_ids": [[1, 2], [3]], "sampling_params": {"n": 2}}, 4),
    ({"logprobs": True, "top_logprobs": 20, "max_tokens": 2048}, 1),
])
def test_the_gate_admits_values_in_range_and_counts_sub_requests(body, count):
    assert check_body(body, RequestLimits(), BOUNDS) == count


@pytest.mark.parametrize("raw", [b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": 1e999}', b"[" * 100000, b"\xff",
                                 b'{"a": ' + b"9" * 5000 + b"}"])
def test_bodies_that_are_not_finite_json_are_refused(raw):
    with pytest.raises(Refused) as refused:
        parse(raw)
    assert refused.value.status == 400 and refused.value.field == "body"


def test_every_route_sglang_serves_is_classed_and_every_generation_route_gated(tmp_path):
    """Read SGLang 0.5.23's own route table (in a clean process: its HTTP module sets up state on import)."""
    script = ("import json; from sglang.srt.entrypoints.http_server import app; "
              "from dspark.integration.routes import route_table; print(json.dumps(route_table(app)))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    table = json.loads(out.stdout.strip().splitlines()[-1])
    by_kind = {kind: sorted(route for route, k in table.items() if k == kind) for kind in set(table.values())}
    gated_paths = {route.split(" ", 1)[1] for route in by_kind["gated"]}
    assert gated_paths == set(VALID), "a route that starts model work is gated, and the fuzz covers every one"
    # A new SGLang route lands here (REFUSED until classed): class it in integration/routes.py
    assert by_kind["refused"] == ["POST /v1/audio/transcriptions", "WS /v1/realtime"]
    assert "POST /update_weights_from_disk" in by_kind["admin"] and "GET /health" in by_kind["open"]



def test_the_route_cache_is_each_classifier_s_own_and_random_paths_cannot_grow_it():
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def generate_request(request):  # the name SGLang's /generate endpoint has
        raise AssertionError("never called: only matched")

    gated = RouteClassifier(Starlette(routes=[Route("/generate", generate_request, methods=["POST"])]))
    empty = RouteClassifier(Starlette())
    assert gated({"type": "http", "method": "POST", "path": "/generate"}) == RouteKind.GATED
    for i in range(1000):
        assert gated({"type": "http", "method": "GET", "path": f"/random/{i}"}) == RouteKind.OPEN
    assert gated._kind.cache_info().currsize == 256 and empty._kind.cache_info().currsize == 0
    assert gated({"type": "http", "method": "POST", "path": "/generate"}) == RouteKind.GATED  # evicted, matched again
    assert empty({"type": "http", "method": "POST", "path": "/generate"}) == RouteKind.OPEN


# ---------------------------------------------------------------- the real server

def test_a_launch_that_would_serve_past_the_gate_stops_naming_each_setting():
    """All of them in one launch, refused where SGLang resolves its arguments, before it starts anything (a first
    start-up that fails is not retried by `dspark serve`: tests/helm/test_lws_rendezvous.py)."""
    flags = ["--tokenizer-worker-num", "2",  # one logprobs: 1000000 crashed the scheduler through a second worker
             "--grpc-port", "50099", "--grpc-mode"]
    refusal = resolve_launch(["--model-path", str(EMBEDDED_TARGET), *cpu_server_args(), *flags],
                             {"SGLANG_RUST_SERVER": "1"})
    for named in ("--tokenizer-worker-num must be 1, got 2", "--grpc-port must be left unset, got 50099",
                  "--grpc-mode / --smg-grpc-mode must be off", "SGLANG_RUST_SERVER must be unset"):
        assert named in refusal
    assert resolve_launch(["--model-path", str(EMBEDDED_TARGET), *cpu_server_args()]) == ""


def refused_400(field: str) -> str:
    return f'dspark_gate_refused_requests_total{{field="{field}",status="400"}}'


def test_each_request_that_crashed_a_replica_gets_a_4xx_and_the_server_keeps_serving(server, reference):
    fields = Counter()
    before = {field: server.metric(refused_400(field)) for field in ("logprobs", "top_logprobs",
                                                                          "top_logprobs_num", "input_ids", "prompt")}
    for path, body in CRASHERS:
        status, answer = post_json(server.url + path, body)
        assert status == 400, (path, answer)
        assert "must be" in answer["message"] and answer["param"] in json.dumps(body), answer
        fields[answer["param"]] += 1
    assert Counter({field: server.metric(refused_400(field)) - count for field, count in before.items()}) == fields
    assert [greedy(server.url, p) for p in PROMPTS] == [reference[p] for p in PROMPTS]


def test_n_of_a_hundred_thousand_is_refused_naming_the_bound(server):
    status, answer = post_json(server.url + "/v1/completions",
                               {"model": "default", "prompt": "x", "n": 100000, "max_tokens": 1})
    assert status == 400 and answer["message"] == "n must be in 1..16, got 100000"


def test_bodies_over_the_cap_get_413_before_they_are_parsed(server):
    too_big = b'{"text": "' + b"a" * (RequestLimits().max_body_bytes + 1) + b'"}'
    status, _, body = post(server.url + "/generate", too_big)
    assert status == 413 and b"Content-Length says" in body
    status, _, body = post(server.url + "/generate", iter([too_big[:1 << 20]] * 5),
                           headers={"Transfer-Encoding": "chunked"})  # no Content-Length: counted as it arrives
    assert status == 413 and b"got more than that" in body


def test_sub_requests_past_the_replica_bound_get_429_with_retry_after(server):
    batch = {"text": ["def f("] * (MAX_QUEUED // 2), "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}}
    refused_before = server.metric(REFUSED_429)
    with ThreadPoolExecutor(2) as pool:
        in_flight = [pool.submit(post_json, server.url + "/generate", batch) for _ in range(2)]
        admitted = server.wait_for_in_flight(MAX_QUEUED)  # not a sleep: on 2 busy cores one may come late
        status, headers, body = post(server.url + "/generate", json.dumps(
            {"text": "x", "sampling_params": {"max_new_tokens": 1}}).encode())
        finished_early = any(f.done() for f in in_flight)
        assert [f.result()[0] for f in in_flight] == [200, 200]
    assert admitted and not finished_early, "both batches must be in flight when the third request comes"
    assert status == 429 and headers.get("retry-after") == "1", body
    assert b"max_queued_requests=16" in body
    assert server.metric(REFUSED_429) == refused_before + 1
    assert server.wait_for_in_flight(0)
    assert post_json(server.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}})[0] == 200


def test_a_generation_route_the_gate_cannot_bound_is_refused(server):
    refused = 'dspark_gate_refused_requests_total{field="path",status="404"}'
    before = server.metric(refused)
    status, _, body = post(server.url + "/v1/audio/transcriptions", b"{}")
    assert status == 404 and b"not served here" in body
    assert server.metric(refused) == before + 1


def test_two_thousand_malformed_requests_from_four_clients_leave_it_serving(server, reference):
    rng = random.Random(41)
    requests = [fuzz_request(rng) for _ in range(FUZZ_REQUESTS)]
    rss_before = serving_rss(server)

    def send(request):
        status, _, body = post(server.url + request.path, request.body, request.content_type, timeout_s=180)
        return request.path, status, body

    with ThreadPoolExecutor(FUZZ_CLIENTS) as pool:
        answers = list(pool.map(send, requests))
    statuses = Counter(status for _, status, _ in answers)
    print("fuzz statuses:", dict(sorted(statuses.items())))
    server_errors = [(path, status, body[:300]) for path, status, body in answers if not 200 <= status < 500]
    assert not server_errors, server_errors[:5]
    assert statuses[200] > 0 and sum(n for s, n in statuses.items() if 400 <= s < 500) > FUZZ_REQUESTS // 2
    assert server.process.poll() is None
    assert [greedy(server.url, p) for p in PROMPTS] == [reference[p] for p in PROMPTS]
    growth = serving_rss(server) - rss_before
    workers = serving_processes(server, workers=True)
    print(f"serving processes grew by {growth / 2 ** 20:.0f} MiB; {len(workers)} bounded workers hold "
          f"{sum(p.memory_info().rss for p in workers) / 2 ** 20:.0f} MiB")
    assert growth < MEMORY_GROWTH_LIMIT
    assert len(workers) <= 2, "one parser worker and one grammar compiler at most, whatever the fuzz killed"
