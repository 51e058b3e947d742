"""The request gate, round 2 (issue 61): each exact input of the second attack pass, sent to a real `dspark serve`.

Two requests killed SGLang's scheduler (`positional_embed_overrides`, `logprob_start_len: -7`), a 25-character
stop_regex hung it for good, the parser routes ran in the HTTP event loop without a bound, grammar compilation
went on after its refusal, and smaller things answered 500 or a wrong 200. Each now gets a 4xx naming the field
(or the right answer), and the server keeps serving.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from dspark.integration.request_gate import ModelBounds, Refused, check_body
from dspark.integration.request_limits import RequestLimits
from dspark.integration.stop_regex import stop_regex_problem, window_clamp

from tests.integration.test_request_gate import post, post_json

pytestmark = pytest.mark.slow

CATASTROPHIC_STOP_REGEX = "([\\s\\S]|[\\s\\S])*\\x01"  # the issue's 25 characters, as JSON writes them
BOUNDS = ModelBounds(vocab=4096, context=2048)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
PYTHONIC_BLOWUP = "[A(" + "A=," * 24  # CVE-2025-48887's shape: SGLang's pythonic regex took 3.7 s at 20 steps here,
# about 4 times as long per step


def alive(url: str) -> bool:
    status, answer = post_json(url + "/generate", {"text": "def f(", "sampling_params": {"max_new_tokens": 2}})
    return status == 200 and len(answer["output_ids"]) == 2


# ------------------------------------------------------------------ the rules, without a server

def test_the_issue_s_stop_regex_is_25_characters_and_refused_as_catastrophic():
    assert json.dumps(CATASTROPHIC_STOP_REGEX) == '"([\\\\s\\\\S]|[\\\\s\\\\S])*\\\\x01"' and \
        len(json.dumps(CATASTROPHIC_STOP_REGEX)) == 25 + 2
    assert "catastrophic" in stop_regex_problem([CATASTROPHIC_STOP_REGEX])


@pytest.mark.parametrize("pattern", ["(a+)+b", "(a*)*", "(a|ab)*c", "(x|x)+", ".*.*.*x", "(", "a" * 257])
def test_stop_regexes_that_could_backtrack_catastrophically_or_do_not_compile_are_refused(pattern):
    assert stop_regex_problem(pattern) is not None


@pytest.mark.parametrize("pattern", ["\n\n", "\\d+\\.\\d+", "(a|b)*c", "(?:foo|bar)", "END$", "(ab)*", "```"])
def test_ordinary_stop_regexes_pass(pattern):
    assert stop_regex_problem(pattern) is None


def test_the_stop_regex_window_is_capped_after_sglang_normalizes():
    from sglang.srt.sampling.sampling_params import SamplingParams

    from transformers import AutoTokenizer

    from tests.paths import EMBEDDED_TARGET

    params = SamplingParams(stop_regex=["a.*b"], max_new_tokens=4)
    params.normalize(AutoTokenizer.from_pretrained(EMBEDDED_TARGET))
    assert params.stop_regex_max_len > 64  # SGLang's own bound for `.*`: the whole output
    window_clamp(64)(None, params)
    assert params.stop_regex_max_len == 64


@pytest.mark.parametrize("body, field", [
    ({"text": "x", "positional_embed_overrides": [[1.0]]}, "positional_embed_overrides"),
    ({"text": "x", "return_logprob": True, "logprob_start_len": -7}, "logprob_start_len"),
    ({"text": "x", "sampling_params": {"is_normalized": True}}, "is_normalized"),
    ({"text": "x", "sampling_params": {"stop_regex_strs": ["(a*)*"]}}, "stop_regex_strs"),
    ({"text": "x", "sampling_params": {"stop_regex_max_len": 1 << 30}}, "stop_regex_max_len"),
    ({"text": "x", "http_worker_ipc": "ipc:///tmp/other"}, "http_worker_ipc"),
    ({"text": "x", "routed_experts_start_len": -1}, "routed_experts_start_len"),
    ({"text": "x", "sampling_params": {"beam_width": 100000}}, "beam_width"),
    ({"prompt": "x", "logit_bias": {"5": 1e39}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"text": "x", "sampling_params": {"ebnf": "root ::= " + '"a" | ' * 20000 + '"b"'}}, "ebnf"),
    ({"text": "\ud800"}, "text"),
    ({"text": "def f(", "sampling_params": [{"role": "user", "content": 5}]}, "sampling_params"),  # fuzz: a 500
    ({"messages": [{"role": "user", "content": "x"}], "response_format": 2}, "response_format"),  # fuzz: a 500
])
def test_each_field_that_reaches_the_scheduler_is_bounded(body, field):
    with pytest.raises(Refused) as refused:
        check_body(body, RequestLimits(), BOUNDS)
    assert (refused.value.status, refused.value.field) == (400, field)
    assert field.split(".")[-1] in refused.value.message


# ---------------------------------------------------------------- the real server

@pytest.mark.parametrize("body, field", [
    ({"text": "def f(", "positional_embed_overrides": [[1.0]], "sampling_params": {"max_new_tokens": 4}},
     "positional_embed_overrides"),
    ({"text": "def f(", "return_logprob": True, "logprob_start_len": -7, "sampling_params": {"max_new_tokens": 4}},
     "logprob_start_len"),
    ({"text": "def f(", "sampling_params": {"max_new_tokens": 4, "stop_regex": [CATASTROPHIC_STOP_REGEX]}},
     "stop_regex"),
    ({"text": "def f(", "sampling_params": {"max_new_tokens": 4, "stop_regex": ["("]}}, "stop_regex"),
])
def test_the_issue_s_scheduler_killers_get_400_naming_the_field_and_it_keeps_serving(dspark_server, body, field):
    """On main the first two killed the scheduler, the third hung it, the fourth answered 500."""
    status, answer = post_json(dspark_server.url + "/generate", body)
    assert (status, answer.get("param")) == (400, field), answer
    assert alive(dspark_server.url)


def test_logit_bias_above_float32_is_refused_not_answered_eos(dspark_server):
    status, answer = post_json(dspark_server.url + "/v1/completions", {
        "model": "default", "prompt": "def f(", "max_tokens": 4, "logit_bias": {"5": 1e39}})
    assert (status, answer.get("param")) == (400, "logit_bias"), answer  # main: 200, finish_reason stop at once


def test_a_lone_surrogate_gets_400_naming_the_field_without_a_path_or_traceback(dspark_server):
    status, _, body = post(dspark_server.url + "/generate",
                           b'{"text": "\\ud800", "sampling_params": {"max_new_tokens": 4}}')
    answer = json.loads(body)
    assert (status, answer["param"]) == (400, "text"), answer
    assert "File" not in answer["message"] and ".py" not in answer["message"] and "surrogate" in answer["message"]


def test_a_type_error_sglang_refuses_names_the_field_without_a_path(dspark_server):
    status, answer = post_json(dspark_server.url + "/generate", {"text": "x", "stream": {"not": "a bool"}})
    assert status == 400 and answer["param"] == "stream", answer
    assert ".py" not in answer["message"] and "Traceback" not in answer["message"]


def test_openapi_json_is_served(dspark_server):
    with urllib.request.urlopen(dspark_server.url + "/openapi.json", timeout=120) as response:
        assert response.status == 200 and "/generate" in json.loads(response.read())["paths"]  # main: 500


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize", "/detokenize", "/v1/messages/count_tokens",
                                  "/separate_reasoning", "/open_session", "/parse_function_call"])
def test_the_utility_routes_cap_their_bodies(dspark_server, path):
    too_big = b'{"prompt": "' + b"a" * RequestLimits().max_utility_body_bytes + b'"}'
    status, _, body = post(dspark_server.url + path, too_big)
    assert status == 413 and b"max_utility_body_bytes" in body, (path, status, body[:200])


def test_tokenize_still_answers(dspark_server):
    status, answer = post_json(dspark_server.url + "/v1/tokenize", {"model": "default", "prompt": "def f("})
    assert status == 200 and answer["tokens"], answer


def test_the_pythonic_parser_blowup_is_stopped_at_the_bound_off_the_event_loop(dspark_server):
    """On main: 14.8 s on ~170 bytes with /health waiting as long; here the worker is killed at parser_timeout_s."""
    status, answer = post_json(dspark_server.url + "/parse_function_call", {
        "text": PYTHONIC_BLOWUP, "tool_call_parser": "pythonic", "tools": [TOOL]})
    assert (status, answer.get("param")) == (400, "text") and "parser_timeout_s" in answer["message"], answer
    status, answer = post_json(dspark_server.url + "/parse_function_call", {
        "text": "[f()]", "tool_call_parser": "pythonic", "tools": [TOOL]})
    assert status == 200 and answer["calls"][0]["name"] == "f", answer  # a fresh worker parses the next one
    status, answer = post_json(dspark_server.url + "/separate_reasoning", {
        "text": "<think>a</think>b", "reasoning_parser": "deepseek-r1"})
    assert status == 200 and answer["text"] == "b", answer


def test_grammars_are_compiled_by_the_gate_first(dspark_server):
    """One that does not compile is refused with XGrammar's reason (no source path), one that does is served."""
    status, answer = post_json(dspark_server.url + "/generate", {
        "text": "def f(", "sampling_params": {"max_new_tokens": 4, "ebnf": "root ::= ("}})
    assert status == 400 and answer["param"] == "ebnf" and "does not compile" in answer["message"], answer
    assert ".cc:" not in answer["message"]
    status, answer = post_json(dspark_server.url + "/generate", {
        "text": "def f(", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}})
    assert status == 200 and answer["text"] in ("yes", "no"), answer


def test_a_grammar_past_the_compile_bound_is_stopped_refused_and_the_next_request_served(dspark_server):
    """3,000 optional literals (about 21 KB, under max_grammar_bytes): XGrammar compiles it for minutes here. On main
    the scheduler compiled it on and later requests waited; here the gate's worker is killed at grammar_compile_s."""
    ebnf = "root ::= " + " ".join(f'"{i}"?' for i in range(3000))
    assert len(ebnf) < RequestLimits().max_grammar_bytes
    status, answer = post_json(dspark_server.url + "/generate", {
        "text": "def f(", "sampling_params": {"max_new_tokens": 4, "ebnf": ebnf}})
    assert (status, answer.get("param")) == (400, "ebnf") and "grammar_compile_s" in answer["message"], answer
    assert alive(dspark_server.url)


def test_a_bounded_worker_kills_the_work_at_its_bound_and_serves_the_next_call():
    import asyncio

    import psutil

    from dspark.integration.bounded_worker import BoundedWorker, TimedOut

    from tests.integration.worker_tasks import nothing, pid, spin

    async def run():
        worker = BoundedWorker(nothing, ())
        first = await worker.call(pid, None, 60)
        with pytest.raises(TimedOut):
            await worker.call(spin, 3600, 0.5)
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        second = await worker.call(pid, None, 60)
        assert second != first and await worker.call(spin, 0, 60) == "finished"
        worker.kill()
    asyncio.run(run())
