"""Random malformed and out-of-range requests for the request gate's fuzz (test_request_gate.py).

Each request starts from a valid body of its route's shape, then either breaks it (a random field, at the top or
in the container SGLang reads sampling fields from, set to a value from a pool of wrong types, out-of-range and
edge values) or replaces the whole body with something that is not a JSON object. The fields are FIELDS and every
field of SGLang's request types (`request_type_fields`: GenerateReqInput, SamplingParams and the OpenAI
completions and chat requests), so a field a later SGLang adds is fuzzed without anyone listing it. Besides the
generation routes, the routes that start no model work but read what they are sent (tokenize, detokenize,
count_tokens, separate_reasoning, parse_function_call) are fuzzed too. Requests that stay valid ask for at most 8
new tokens, so the fuzz costs little generation.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, fields
from functools import lru_cache

MESSAGES = [{"role": "user", "content": "def f("}]
VALID = {
    "/generate": {"text": "def f(", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    "/v1/completions": {"model": "default", "prompt": "def f(", "max_tokens": 4},
    "/v1/chat/completions": {"model": "default", "messages": MESSAGES, "max_tokens": 4},
    "/invocations": {"model": "default", "messages": MESSAGES, "max_tokens": 4},
    "/v1/messages": {"model": "default", "messages": MESSAGES, "max_tokens": 4},
    "/api/generate": {"model": "default", "prompt": "def f(", "options": {"num_predict": 4}, "stream": False},
    "/api/chat": {"model": "default", "messages": MESSAGES, "options": {"num_predict": 4}, "stream": False},
    "/v1/responses": {"model": "default", "input": "def f(", "max_output_tokens": 4},
    "/vertex_generate": {"instances": [{"text": "def f("}], "parameters": {"sampling_params": {"max_new_tokens": 4}}},
    "/v1/score": {"query": "def f(", "items": ["a", "b"], "label_token_ids": [1, 2]},
    "/v1/embeddings": {"model": "default", "input": "def f("},
    "/encode": {"text": "def f("},
    "/classify": {"text": "def f("},
    "/v1/classify": {"model": "default", "input": "def f("},
    "/v1/rerank": {"query": "def f(", "documents": ["a"]},
    "/v1/decisions": {"model": "default", "input": "def f("},
    "/v1/systemone": {"model": "default", "input": "def f("},
}
UTILITY_VALID = {  # routes that start no model work but parse or tokenize the body
    "/tokenize": {"model": "default", "prompt": "def f("},
    "/v1/detokenize": {"model": "default", "tokens": [1, 2, 3]},
    "/v1/messages/count_tokens": {"model": "default", "messages": MESSAGES},
    "/separate_reasoning": {"text": "<think>a</think>b", "reasoning_parser": "deepseek-r1"},
    "/parse_function_call": {"text": "[f()]", "tool_call_parser": "pythonic",
                             "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
}
CONTAINER = {"/generate": "sampling_params", "/api/generate": "options", "/api/chat": "options"}
FIELDS = ("logprobs", "top_logprobs", "top_logprobs_num", "return_logprob", "n", "best_of", "max_tokens",
          "max_new_tokens", "max_completion_tokens", "max_output_tokens", "num_predict", "input_ids", "prompt",
          "text", "input", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "logit_bias",
          "stream", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty", "messages",
          "logprob_start_len", "token_ids_logprob", "label_token_ids", "items", "echo", "min_tokens", "rid")
MAX_TOKEN_FIELDS = ("max_tokens", "max_new_tokens", "max_completion_tokens", "max_output_tokens", "num_predict",
                    "min_tokens")
OUT_OF_RANGE = (-1, -(2 ** 31), 2 ** 31, 2 ** 63, 10 ** 30, 1000000, 4096, 4097, 1e308, -1e308, 1.5, "1000000",
                "-1", "NaN", "inf", "")
VALUES = OUT_OF_RANGE + (0, 1, 2, 8, True, False, None, "x", "\x00", "é" * 50, [], {}, [[]], [-1], [0, 1],
                         [1000000], [[5, 6], [2 ** 40]], ["a", 3], {"1000000": 100}, {"5": 1e30}, {"a": "b"},
                         [{"role": "user"}], [{"role": "user", "content": 5}], [1] * 5000, [[1.0]], -7,
                         "([\\s\\S]|[\\s\\S])*\\x01", "(", ["("], "\ud800", {"5": 1e39}, "root ::= (",
                         {"type": "object"}, 100000)
SMALL_TOKENS = (0, 1, 4, 8)


@dataclass(frozen=True)
class FuzzRequest:
    path: str
    body: bytes
    content_type: str = "application/json"


@lru_cache(maxsize=1)
def request_type_fields() -> tuple[str, ...]:
    """Every field name of SGLang 0.5.23's request types that a client can send."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    names = {f.name for f in fields(GenerateReqInput)} | set(SamplingParams.__struct_fields__)
    names |= set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    return tuple(sorted(names))


def all_fields() -> tuple[str, ...]:
    return tuple(sorted(set(FIELDS) | set(request_type_fields())))


def field_value(rng: random.Random, field: str):
    if field in MAX_TOKEN_FIELDS and rng.random() < 0.3:
        return rng.choice(SMALL_TOKENS)
    if field in MAX_TOKEN_FIELDS:  # never a valid large budget: the fuzz must stay cheap
        return rng.choice([v for v in OUT_OF_RANGE if not isinstance(v, (int, float)) or v < 0 or v > 4096])
    return rng.choice(VALUES)


def broken_body(rng: random.Random) -> tuple[bytes, str]:
    return rng.choice([
        (b"", "application/json"), (b"{", "application/json"), (b'{"text": NaN}', "application/json"),
        (b'{"text": "a", "sampling_params": {"temperature": Infinity}}', "application/json"),
        (b"[" * 5000 + b"]" * 5000, "application/json"), (b"\xff\xfe\x00garbage", "application/json"),
        (b'"just a string"', "application/json"), (b"[1, 2, 3]", "application/json"), (b"null", "application/json"),
        (b'{"text": "def f("}', "text/plain"), (b'{"text": "' + b"9" * 5000 + b'"}', "application/json"),
        (b'{"input_ids": [' + b"9" * 5000 + b']}', "application/json"),
    ])


def fuzz_request(rng: random.Random) -> FuzzRequest:
    valid = {**VALID, **UTILITY_VALID}
    path = rng.choice(sorted(valid))
    if rng.random() < 0.15:
        body, content_type = broken_body(rng)
        return FuzzRequest(path, body, content_type)
    body = json.loads(json.dumps(valid[path]))
    for _ in range(rng.choice((1, 1, 2, 3))):
        field = rng.choice(all_fields())
        container = body.get(CONTAINER.get(path, ""), None) if rng.random() < 0.5 else None
        (container if isinstance(container, dict) else body)[field] = field_value(rng, field)
    if path == "/generate" and rng.random() < 0.1:  # a batch
        body["text"] = ["def f("] * rng.choice((2, 8, 40))
    return FuzzRequest(path, json.dumps(body).encode())
