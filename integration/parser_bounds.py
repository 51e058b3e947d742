"""/parse_function_call and /separate_reasoning run their parser in a bounded worker process, not in the event loop.

SGLang 0.5.23 runs both parsers inside the async endpoint, in the one HTTP process: the pythonic tool parser took
14.8 s on about 170 bytes (vLLM's CVE-2025-48887 pattern), and `/health` waited as long. The request gate
answers these two routes itself: the body is capped (max_utility_body_bytes), checked for the fields the
endpoint reads, and parsed by SGLang's own parser classes in a BoundedWorker (bounded_worker.py) with the
served tokenizer, killed past `parser_timeout_s`: 400 naming `text` and the bound.

The answers are SGLang's own shapes. Parsers that SGLang runs through a served model's chat-encoding adapter
(chat_encoding_adapters.ADAPTER_OUTPUT_PARSERS) parse with that model's own tokenizer objects; those names are
left to SGLang's endpoint.
"""
from __future__ import annotations

from typing import Any

from dspark.models.errors import shown

PARSE_FUNCTION_CALL, SEPARATE_REASONING = "parse_function_call_request", "separate_reasoning_request"
PARSER_ENDPOINTS = frozenset({PARSE_FUNCTION_CALL, SEPARATE_REASONING})


class ParserRequestError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def load_tokenizer(path: str, mode: str, trust_remote_code: bool, revision):
    """The worker's setup: the served tokenizer, as SGLang's tokenizer manager loads it."""
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    return get_tokenizer(path, tokenizer_mode=mode, trust_remote_code=trust_remote_code, revision=revision)


def parsers_ready(*tokenizer_args):
    """The parser worker's setup: the served tokenizer, with the parser modules imported here, so that a call's
    time bound is spent parsing (importing them took seconds on a busy CPU)."""
    import sglang.srt.entrypoints.openai.protocol  # noqa: F401
    import sglang.srt.function_call.function_call_parser  # noqa: F401
    import sglang.srt.parser.reasoning_parser  # noqa: F401

    return load_tokenizer(*tokenizer_args)


def parse_function_call(tokenizer, payload: dict) -> dict:
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    tools = [Tool.model_validate(tool) for tool in payload.get("tools") or []]
    parser = FunctionCallParser(tools=tools, tool_call_parser=payload.get("tool_call_parser"), tokenizer=tokenizer)
    normal_text, calls = parser.parse_non_stream(payload["text"])
    return {"normal_text": normal_text, "calls": [call.model_dump() for call in calls]}


def separate_reasoning(tokenizer, payload: dict) -> dict:
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    parser = ReasoningParser(model_type=payload["reasoning_parser"], tokenizer=tokenizer)
    if payload.get("return_blocks"):
        blocks = parser.parse_non_stream_blocks(payload["text"])
        answer = {"reasoning_text": "".join(b["text"] for b in blocks if b["type"] == "reasoning"),
                  "text": "".join(b["text"] for b in blocks if b["type"] == "text")}
        answer.update(reasoning_blocks=[b["text"] for b in blocks if b["type"] == "reasoning"],
                      text_blocks=[b["text"] for b in blocks if b["type"] == "text"], blocks=blocks)
        return answer
    reasoning_text, text = parser.parse_non_stream(payload["text"])
    return {"reasoning_text": reasoning_text, "text": text}


TASKS = {PARSE_FUNCTION_CALL: parse_function_call, SEPARATE_REASONING: separate_reasoning}
PARSER_FIELD = {PARSE_FUNCTION_CALL: "tool_call_parser", SEPARATE_REASONING: "reasoning_parser"}


def check_payload(endpoint: str, payload: Any) -> None:
    """The fields the endpoint reads, of the types SGLang's request types declare."""
    if not isinstance(payload, dict):
        raise ParserRequestError("body", f"the request body must be a JSON object, got {type(payload).__name__}")
    if not isinstance(payload.get("text"), str):
        raise ParserRequestError("text", f"text must be a string, got {shown(payload.get('text'))}")
    name = PARSER_FIELD[endpoint]
    required = endpoint == SEPARATE_REASONING
    if not (isinstance(payload.get(name), str) or (payload.get(name) is None and not required)):
        raise ParserRequestError(name, f"{name} must be a string, got {shown(payload.get(name))}")
    if endpoint == PARSE_FUNCTION_CALL and not isinstance(payload.get("tools", []), list):
        raise ParserRequestError("tools", f"tools must be a list, got {shown(payload.get('tools'))}")


def runs_in_worker(endpoint: str, payload: dict) -> bool:
    """False for the parsers SGLang runs through a served model's chat-encoding adapter (module docstring)."""
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import ADAPTER_OUTPUT_PARSERS

    name = payload.get(PARSER_FIELD[endpoint])
    return not any(name in names for names in ADAPTER_OUTPUT_PARSERS.values())


def served_tokenizer_args() -> tuple:
    """load_tokenizer's arguments for the served model, read where SGLang's tokenizer manager reads them (its
    runtime context: in 0.5.23 the launcher's ServerArgs object leaves them unset)."""
    from sglang.srt.runtime_context import get_model, get_serving

    return (get_serving().tokenizer_path, get_serving().tokenizer_mode, get_model().trust_remote_code,
            get_model().revision)
