"""The request fields of SGLang 0.5.23 that reach the scheduler, each bounded (the request gate calls `check_scope`
for the body and each container in it, and `check_strings` once for the whole body).

Gone through field by field: `GenerateReqInput` (managers/io_struct.py), `SamplingParams`
(sampling/sampling_params.py) and the OpenAI protocol (entrypoints/openai/protocol.py). Numbers already fit 32
bits (64 for seeds) and token ids the vocabulary (request_gate.py); the fields below need more:

    positional_embed_overrides  a tensor type for the Python Engine; over HTTP a list killed the scheduler
                                ('list' object has no attribute 'reconstruct'): refused
    http_worker_ipc, lora_id    set by SGLang itself (the worker that owns a request, the LoRA's uid): refused
    stop_strs, stop_regex_strs, stop_str_max_len, stop_regex_max_len, is_normalized, ebnf_full_assistant
                                SamplingParams' internal fields, which normalize() derives: sent by a client they
                                skip its checks (is_normalized skips __post_init__): refused
    logprob_start_len           -1 (output only) or 0..context: -7 killed the scheduler (an AssertionError)
    routed_experts_start_len, max_thinking_tokens   0..context
    beam_width                  1..max_n, counted as completions like n
    logit_bias                  values finite in [-100, 100] (OpenAI's range): 1e39 overflowed float32 and every
                                answer was EOS
    stop_regex                  stop_regex.py
    json_schema, regex, ebnf, structural_tag, response_format   at most max_grammar_bytes; response_format an
                                object (2 raised inside SGLang's validator: a 500)
    sampling_params             only SamplingParams' own fields, as objects (an unknown key raised a TypeError
                                in SGLang's handler: a 500)
    any string                  no lone surrogate (SGLang's answer held a file path and a traceback)
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any, Iterator, Optional

from dspark.integration.stop_regex import stop_regex_problem
from dspark.models.errors import shown

REFUSED_FIELDS = {
    "positional_embed_overrides": "embedding overrides are a tensor type of SGLang's Python Engine, not of HTTP",
    "http_worker_ipc": "SGLang sets it to the HTTP worker that owns a request",
    "lora_id": "SGLang sets it from lora_path",
    "stop_strs": "it is SGLang's internal form of stop: send stop",
    "stop_regex_strs": "it is SGLang's internal form of stop_regex: send stop_regex",
    "stop_str_max_len": "SGLang derives it from stop",
    "stop_regex_max_len": "SGLang derives it from stop_regex",
    "is_normalized": "SGLang sets it once it has checked the sampling parameters",
    "ebnf_full_assistant": "SGLang sets it for its own tool grammars",
}
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag", "response_format")
LOGIT_BIAS_RANGE = (-100.0, 100.0)


class FieldRefusal(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def integers(value: Any) -> Iterator[Any]:
    """The value, or each item of a list of per-prompt values."""
    yield from value if isinstance(value, list) else [value]


def check_int_range(field: str, value: Any, low: int, high: int) -> None:
    for item in integers(value):
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int) or not low <= item <= high:
            raise FieldRefusal(field, f"{field} must be an integer in {low}..{high}, got {shown(item)}")


def check_logit_bias(bias: Any) -> None:
    if not isinstance(bias, dict):
        return
    low, high = LOGIT_BIAS_RANGE
    for token, value in bias.items():
        x = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if x is None or not math.isfinite(x) or not low <= x <= high:
            raise FieldRefusal("logit_bias", f"logit_bias values must be numbers in [{low:g}, {high:g}], got "
                                             f"{shown(value)} for token {shown(token)}")


def grammar_size(value: Any) -> int:
    return len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(json.dumps(value))


def check_scope(scope: dict, max_n: int, context: int, max_grammar_bytes: int) -> int:
    """Refuse what `scope` (the body or one container of sampling fields) may not carry; the completions per prompt
    its beam_width asks for (1 without one)."""
    for field, why in REFUSED_FIELDS.items():
        if scope.get(field) is not None:
            raise FieldRefusal(field, f"{field} may not be sent: {why}")
    check_int_range("logprob_start_len", scope.get("logprob_start_len"), -1, context)
    check_int_range("routed_experts_start_len", scope.get("routed_experts_start_len"), 0, context)
    check_int_range("max_thinking_tokens", scope.get("max_thinking_tokens"), 0, context)
    check_int_range("beam_width", scope.get("beam_width"), 1, max_n)
    check_logit_bias(scope.get("logit_bias"))
    problem = stop_regex_problem(scope.get("stop_regex"))
    if problem:
        raise FieldRefusal("stop_regex", problem)
    if scope.get("response_format") is not None and not isinstance(scope["response_format"], dict):
        raise FieldRefusal("response_format", f"response_format must be an object, got "
                                              f"{shown(scope['response_format'])}")
    for field in GRAMMAR_FIELDS:
        value = scope.get(field)
        if value is not None and grammar_size(value) > max_grammar_bytes:
            raise FieldRefusal(field, f"{field} must be at most {max_grammar_bytes} bytes (max_grammar_bytes), "
                                      f"got {grammar_size(value)}")
    beam = scope.get("beam_width")
    return beam if isinstance(beam, int) and not isinstance(beam, bool) else 1


@lru_cache(maxsize=1)
def sampling_param_names() -> frozenset:
    """What a client may put in /generate's sampling_params: SamplingParams' fields less its internal ones."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    return frozenset(SamplingParams.__struct_fields__) - set(REFUSED_FIELDS)


def check_sampling_params(value: Any, known: frozenset) -> None:
    """/generate's sampling_params (an object, or one per prompt) hold objects of known keys only (REFUSED_FIELDS
    are named by check_scope)."""
    for item in value if isinstance(value, list) else [value]:
        if item is None:
            continue
        if not isinstance(item, dict):
            raise FieldRefusal("sampling_params", f"sampling_params must be an object or a list of objects, got "
                                                  f"{shown(item)}")
        unknown = sorted(key for key in item if key not in known and key not in REFUSED_FIELDS)
        if unknown:
            raise FieldRefusal("sampling_params", f"sampling_params has no field {shown(unknown[0])}")


def lone_surrogate_field(body: Any) -> Optional[str]:
    """The key (dotted path) of the first string in `body` holding a lone surrogate (JSON's \\ud800 escapes: no
    UTF-8 text can carry one); None when there is none."""
    stack = [("body", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key if path == "body" else f"{path}.{key}", key))
                stack.append((key if path == "body" else f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend((path, item) for item in value)
    return None


def check_strings(body: Any) -> None:
    field = lone_surrogate_field(body)
    if field is not None:
        raise FieldRefusal(field, f"{shown(field)} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape "
                                  f"without its pair), which no UTF-8 text can carry")
