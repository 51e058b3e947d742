"""Lossless with every request feature: the same request to `dspark serve` with DSpark and with `--no-spec`.

Two real servers of the embedded default (the session's shared `dspark_server`: DSpark with dspark's plugin,
drafting every round, every draft verified; and `nospec_server`: the target alone). Each cell of the matrix sends
one request to both and compares what a client sees:
- at temperature 0: the text, the token ids, the finish reason and the usage counts; logprobs and top logprobs equal
  within LOGPROB_TOLERANCE (a verify forward scores a window where a decode forward scores one token: the float32
  sums differ in order; measured below 1e-5 on these prompts);
- at temperature > 0, where sampling matters (grammar, penalties, top-k/top-p/min-p, n): the distribution of a short
  continuation over many samples, by a chi-square test of the two servers' counts;
- or both servers refuse it alike (a 400 that names the feature).
docs/serving.md lists every row with its status and its test.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from scipy.stats import chi2_contingency

from tests.integration.dspark_serve import CHUNKED_PREFILL_TOKENS, GAMMA, DsparkServe
from tests.paths import EMBEDDED_TARGET

pytestmark = pytest.mark.slow

LOGPROB_TOLERANCE = 1e-4
PROMPT = "def fibonacci(n):\n    "
PROMPTS = [PROMPT, "import os\nimport sys\n\n\ndef main(", "class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def put(self, item):\n        "]
MAX_NEW_TOKENS = 48
CONTEXT_LENGTH = 2048  # embedded/target's max_position_embeddings
P_MIN = 1e-3  # a chi-square p-value below it fails the distribution test


def call(server: DsparkServe, path: str, body: dict, timeout_s: float = 300) -> tuple[int, object]:
    """(status, parsed JSON body) of a POST; an error status is returned, not raised."""
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def generate(text=PROMPT, **sampling) -> dict:
    return {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, **sampling}}


def answer(item: dict) -> dict:
    """What a /generate client reads of one answer, logprobs aside."""
    meta = item["meta_info"]
    return {"text": item["text"], "output_ids": item.get("output_ids"), "finish_reason": meta["finish_reason"],
            "prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"]}


LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs")


def logprob_values(meta: dict) -> tuple[list, list]:
    """(token ids, logprob values) of every logprob list in one answer's meta_info, in order."""
    ids, values = [], []

    def walk(node):
        if isinstance(node, list) and len(node) >= 2 and isinstance(node[1], int) and \
                (node[0] is None or isinstance(node[0], float)):
            values.append(node[0])
            ids.append(node[1])
        elif isinstance(node, list):
            for child in node:
                walk(child)
    for key in LOGPROB_KEYS:
        walk(meta.get(key))
    return ids, values


def assert_logprobs_close(ids_values_a, ids_values_b) -> float:
    (ids_a, values_a), (ids_b, values_b) = ids_values_a, ids_values_b
    assert ids_a == ids_b and len(values_a) == len(values_b)
    gaps = [abs(a - b) for a, b in zip(values_a, values_b) if a is not None or b is not None]
    assert all(a is not None and b is not None for a, b in zip(values_a, values_b) if a is not None or b is not None)
    worst = max(gaps, default=0.0)
    assert worst <= LOGPROB_TOLERANCE, worst
    return worst


def both(dspark: DsparkServe, nospec: DsparkServe, path: str, body: dict) -> tuple[tuple, tuple]:
    return call(dspark, path, body), call(nospec, path, body)


def assert_same_generate(dspark, nospec, body: dict) -> list[dict]:
    (status_d, out_d), (status_n, out_n) = both(dspark, nospec, "/generate", body)
    assert status_d == status_n == 200, (status_d, out_d, status_n, out_n)
    items_d, items_n = (out if isinstance(out, list) else [out] for out in (out_d, out_n))
    assert [answer(i) for i in items_d] == [answer(i) for i in items_n]
    for item_d, item_n in zip(items_d, items_n):
        assert_logprobs_close(logprob_values(item_d["meta_info"]), logprob_values(item_n["meta_info"]))
    return items_d


T0_CELLS = {
    "plain": generate(),
    "batch of prompts": generate(text=PROMPTS),
    "json_schema": generate(json_schema=json.dumps({
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "size": {"type": "integer"}},
        "required": ["name", "size"]})),
    "regex": generate(regex=r"(def|class) [a-z_]{1,16}\((self)?\):"),
    "ebnf": generate(ebnf='root ::= "return " expr\nexpr ::= [a-z]+ | [a-z]+ " + " expr'),
    "structural_tag": generate(structural_tag=json.dumps({
        "type": "structural_tag", "structures": [{"begin": "<call>", "schema": {"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]}, "end": "</call>"}], "triggers": ["<call>"]})),
    "stop string inside an accepted block": generate(stop=["return"]),
    "many stop strings": generate(stop=["xyz", "fib", "    if", ":\n", "))"]),
    "stop_regex": generate(stop_regex=[r"if [a-z]+ "]),
    "stop token ids": generate(stop_token_ids=[13, 30, 100]),
    "frequency_penalty": generate(frequency_penalty=1.0),
    "presence_penalty": generate(presence_penalty=1.0),
    "repetition_penalty": generate(repetition_penalty=1.3),
    "all penalties at once, batched": generate(text=PROMPTS, frequency_penalty=0.4, presence_penalty=0.3,
                                                repetition_penalty=1.1),
    "min_new_tokens": generate(min_new_tokens=40, max_new_tokens=48),
    "min_new_tokens with eos soon": generate(text="x = 1\n", min_new_tokens=12, max_new_tokens=16),
    "logit_bias": generate(logit_bias={"220": 3.0, "13": -5.0}),
    "logit_bias with penalties": generate(logit_bias={"220": 2.0}, frequency_penalty=0.5, repetition_penalty=1.2),
    "ignore_eos": generate(ignore_eos=True, max_new_tokens=64),
    "max_new_tokens ending inside a draft block": generate(max_new_tokens=GAMMA + 3),
    "max_new_tokens 1": generate(max_new_tokens=1),
    "n=2": generate(n=2),
    "logprobs with top logprobs": {**generate(), "return_logprob": True, "top_logprobs_num": 5},
    "logprobs from logprob_start_len": {**generate(), "return_logprob": True, "top_logprobs_num": 3,
                                        "logprob_start_len": 2},
    "logprobs with penalties": {**generate(frequency_penalty=1.0), "return_logprob": True, "top_logprobs_num": 2},
    "return_text_in_logprobs": {**generate(), "return_logprob": True, "return_text_in_logprobs": True},
}


@pytest.mark.parametrize("cell", T0_CELLS)
def test_generate_at_temperature_0_is_identical(dspark_server, nospec_server, cell):
    assert_same_generate(dspark_server, nospec_server, T0_CELLS[cell])


def test_penalties_change_the_answer_so_the_cells_above_can_fail(nospec_server):
    """The penalty rows compare something: the target alone answers differently with each penalty."""
    plain = answer(call(nospec_server, "/generate", generate())[1])
    for penalty in ({"frequency_penalty": 1.0}, {"presence_penalty": 1.0}, {"repetition_penalty": 1.3}):
        assert answer(call(nospec_server, "/generate", generate(**penalty))[1])["output_ids"] != plain["output_ids"]


def test_a_prompt_near_the_context_limit(dspark_server, nospec_server):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)("x = 1\n" * 1000).input_ids[:CONTEXT_LENGTH - 40]
    answers = assert_same_generate(dspark_server, nospec_server, {"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": 39, "ignore_eos": True}})
    assert answers[0]["meta_info"]["prompt_tokens"] + answers[0]["meta_info"]["completion_tokens"] >= \
        CONTEXT_LENGTH - 2  # SGLang stops a request at the context's end


def test_a_long_prompt_prefilled_in_chunks(dspark_server, nospec_server):
    """Both servers prefill in chunks of CHUNKED_PREFILL_TOKENS; a prompt of several chunks."""
    long = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(60))
    answers = assert_same_generate(dspark_server, nospec_server, generate(text=long))
    assert answers[0]["meta_info"]["prompt_tokens"] > 3 * CHUNKED_PREFILL_TOKENS


def test_a_radix_cache_hit(dspark_server, nospec_server):
    prefix = "".join(f"value_{i} = {i}\n" for i in range(40))
    first = assert_same_generate(dspark_server, nospec_server, generate(text=prefix + "def total("))
    again = assert_same_generate(dspark_server, nospec_server, generate(text=prefix + "def total("))
    assert answer(again[0]) == answer(first[0]) and again[0]["meta_info"]["cached_tokens"] > 0


def openai_view(route: str, body: dict) -> dict:
    choices = [{key: choice.get(key) for key in ("text", "message", "finish_reason", "logprobs", "index")}
               for choice in body["choices"]]
    for choice in choices:
        if choice["message"] is not None:
            choice["message"] = {k: v for k, v in choice["message"].items() if k != "tool_calls"} | {
                "tool_calls": [{"function": call["function"]} for call in choice["message"].get("tool_calls") or []]}
    return {"choices": choices, "usage": {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens")}}


def split_floats(node, floats: list):
    """`node` with every float replaced by None (dict keys in sorted order), the floats appended to `floats`."""
    if isinstance(node, float):
        floats.append(node)
        return None
    if isinstance(node, dict):
        return {key: split_floats(node[key], floats) for key in sorted(node)}
    if isinstance(node, list):
        return [split_floats(child, floats) for child in node]
    return node


OPENAI_CELLS = {
    "completions": ("/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_NEW_TOKENS, "temperature": 0}),
    "completions with logprobs": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                                      "logprobs": 3}),
    "completions echo with logprobs": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                           "logprobs": 2, "echo": True}),
    "completions n=2": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "n": 2}),
    "completions best_of": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "n": 1,
                                                "best_of": 2}),
    "completions penalties and stop": ("/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_NEW_TOKENS,
                                                           "temperature": 0, "frequency_penalty": 0.8,
                                                           "presence_penalty": 0.4, "stop": ["\n\n"]}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "def reverse(items):"}],
                                      "max_tokens": MAX_NEW_TOKENS, "temperature": 0}),
    "chat with logprobs and top logprobs": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "def reverse(items):"}], "max_tokens": 16, "temperature": 0,
        "logprobs": True, "top_logprobs": 4}),
    "chat json mode": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "a point as JSON"}], "max_tokens": 48, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "point", "schema": {
            "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "required": ["x", "y"]}}}}),
    "chat tool call": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "add 2 and 3"}], "max_tokens": 64, "temperature": 0,
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}}],
        "tool_choice": {"type": "function", "function": {"name": "add"}}}),
}


@pytest.mark.parametrize("cell", OPENAI_CELLS)
def test_openai_routes_at_temperature_0_are_identical(dspark_server, nospec_server, cell):
    route, body = OPENAI_CELLS[cell]
    body = {"model": "target", **body}
    (status_d, out_d), (status_n, out_n) = both(dspark_server, nospec_server, route, body)
    assert status_d == status_n, (status_d, out_d, status_n, out_n)
    if status_d != 200:  # refused alike, by name
        assert out_d == out_n
        return
    floats_d, floats_n = [], []
    assert split_floats(openai_view(route, out_d), floats_d) == split_floats(openai_view(route, out_n), floats_n)
    assert max((abs(a - b) for a, b in zip(floats_d, floats_n)), default=0.0) <= LOGPROB_TOLERANCE


def streamed(server: DsparkServe, body: dict) -> list[dict]:
    request = urllib.request.Request(server.url + "/generate", json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data:"):]))
    return chunks


def test_streaming_chunks_build_the_non_streamed_answer(dspark_server, nospec_server):
    """Each chunk of SGLang's /generate stream holds the answer so far: every chunk extends the one before, with no
    token repeated or lost at a block boundary, and the last is the non-streamed answer."""
    whole = assert_same_generate(dspark_server, nospec_server, generate(text=PROMPTS, max_new_tokens=40))
    for prompt, expected in zip(PROMPTS, whole):
        for server in (dspark_server, nospec_server):
            chunks = streamed(server, generate(text=prompt, max_new_tokens=40))
            ids = [chunk["output_ids"] for chunk in chunks]
            assert all(ids[i + 1][:len(ids[i])] == ids[i] and len(ids[i + 1]) > len(ids[i])
                       for i in range(len(ids) - 1))
            assert answer(chunks[-1]) == answer(expected)


def test_a_batch_mixing_greedy_and_sampled_requests_keeps_the_greedy_answers(dspark_server, nospec_server):
    greedy = [generate(text=p) for p in PROMPTS]
    expected = [answer(call(nospec_server, "/generate", body)[1]) for body in greedy]
    sampled = [generate(text=p, temperature=1.0, top_p=0.9) for p in PROMPTS * 2]
    with ThreadPoolExecutor(len(greedy) + len(sampled)) as pool:
        futures = [pool.submit(call, dspark_server, "/generate", body) for body in sampled + greedy]
        results = [future.result() for future in futures]
    assert all(status == 200 for status, _ in results)
    assert [answer(out) for _, out in results[len(sampled):]] == expected


def test_an_abort_mid_stream_leaves_the_rest_of_the_batch_unchanged(dspark_server, nospec_server):
    others = [generate(text=p, max_new_tokens=64, ignore_eos=True) for p in PROMPTS]
    expected = [answer(call(nospec_server, "/generate", body)[1]) for body in others]
    aborted = threading.Event()

    def abandoned_stream():
        body = {**generate(max_new_tokens=512, ignore_eos=True), "stream": True}
        request = urllib.request.Request(dspark_server.url + "/generate", json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            for count, _ in enumerate(response):
                if count == 8:  # a few chunks in: the client goes away
                    aborted.set()
                    return

    with ThreadPoolExecutor(len(others) + 1) as pool:
        stream = pool.submit(abandoned_stream)
        assert aborted.wait(120)
        futures = [pool.submit(call, dspark_server, "/generate", body) for body in others]
        results = [future.result() for future in futures]
        stream.result()
    assert [answer(out) for _, out in results] == expected


def test_a_seed_is_served_as_the_target_alone_serves_it(dspark_server, nospec_server):
    """SGLang honours a seed only under --enable-deterministic-inference (where the gate refuses a seeded sampled
    request to DSpark: test_request_gate_penalties.py); otherwise both servers serve it, and a greedy request
    with a seed stays identical."""
    status, out = call(dspark_server, "/generate", generate(temperature=1.0, sampling_seed=1234, max_new_tokens=16))
    assert status == 200 and out["meta_info"]["completion_tokens"] > 0
    assert_same_generate(dspark_server, nospec_server, generate(sampling_seed=1234))


def test_a_session_continues_identically(dspark_server, nospec_server):
    results = []
    for server in (dspark_server, nospec_server):
        status, session = call(server, "/open_session", {"capacity_of_str_len": 4096})
        assert status == 200, session
        turns = []
        rid = None
        for text in (PROMPT, "\n# and again\n"):
            status, out = call(server, "/generate", {**generate(text=text, max_new_tokens=16),
                                                     "session_params": {"id": session, "rid": rid}})
            assert status == 200, out
            rid = out["meta_info"]["id"]
            turns.append(answer(out))
        call(server, "/close_session", {"session_id": session})
        results.append(turns)
    assert results[0] == results[1]


@pytest.mark.parametrize("policy", ["causal", "lagged", "threshold", "fixed", "mtp1", "sglang"])
def test_every_verification_policy_is_lossless(dspark_server_restored, nospec_server, policy):
    client = dspark_server_restored.client(dspark_server_restored.admin_token)
    try:
        client.update({"policy": policy, **({"threshold": 0.3} if policy == "threshold" else {})})
    finally:
        client.close()
    for body in (generate(text=PROMPTS), generate(text=PROMPTS, frequency_penalty=0.6, repetition_penalty=1.2),
                 T0_CELLS["json_schema"], T0_CELLS["stop string inside an accepted block"]):
        assert_same_generate(dspark_server_restored, nospec_server, body)


SAMPLED_CELLS = {
    "plain": {},
    "top_k, top_p and min_p": {"top_k": 8, "top_p": 0.9, "min_p": 0.05},
    "penalties": {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repetition_penalty": 1.3},
    "regex": {"regex": r"[a-z]{1,3}[ (:]"},
}
SAMPLES = 320  # in requests of PER_REQUEST samples (n, within the gate's default max_n of 16)
PER_REQUEST = 16
CONTINUATION = 3


def continuations(server: DsparkServe, sampling: dict) -> Counter:
    """The first CONTINUATION tokens of SAMPLES sampled answers (n samples per request)."""
    counts = Counter()
    for _ in range(SAMPLES // PER_REQUEST):
        status, out = call(server, "/generate", {"text": "    return fib(n - 1) + fib(n - 2)\n\ndef ", "sampling_params": {
            "temperature": 1.0, "max_new_tokens": CONTINUATION, "n": PER_REQUEST, **sampling}})
        assert status == 200, out
        counts.update(tuple(item["output_ids"][:CONTINUATION]) for item in out)
    return counts


@pytest.mark.parametrize("cell", SAMPLED_CELLS)
def test_sampled_continuations_follow_the_target_distribution(dspark_server, nospec_server, cell):
    """Two samples of the same distribution: a chi-square test of homogeneity over the continuations seen in
    both (the rest pooled into one bin)."""
    counts_d, counts_n = continuations(dspark_server, SAMPLED_CELLS[cell]), continuations(nospec_server,
                                                                                         SAMPLED_CELLS[cell])
    common = [key for key in counts_d if counts_d[key] + counts_n[key] >= 10]
    table = [[counts_d[key] for key in common] + [SAMPLES - sum(counts_d[key] for key in common)],
             [counts_n[key] for key in common] + [SAMPLES - sum(counts_n[key] for key in common)]]
    table = [[row[i] for i in range(len(row)) if table[0][i] + table[1][i] > 0] for row in table]
    assert len(table[0]) >= 2, counts_d
    assert chi2_contingency(table).pvalue > P_MIN, (cell, counts_d.most_common(8), counts_n.most_common(8))
