"""One captured request and its served reply as a `dspark regenerate` record (models/training/regenerate.py), so that
`dspark train --data FILE` reads a capture file as it reads regenerate's output.

    {"index": i,                                  the record's line in its file, from 0 (the writer sets it)
     "messages": [..., {"role": "assistant", "content": the served reply}],
     "reply_tokens": n,                           the reply's tokens (SGLang's completion_tokens)
     "sampling": {...},                           what the request asked (absent keys: the server's defaults)
     "route": "/v1/chat/completions", "stream": false, "captured_at": unix seconds,
     "prompt": "..."                              /generate and /v1/completions only: the raw prompt as sent (it
                                                  is also the one user turn of "messages")
     "acceptance": {"completion_tokens": n, "spec_verify_ct": v, "accepted_per_verify": n / v},
     "target": {"path", "sha256"}, "drafter": {"path", "sha256"} or null}

The earlier assistant turns of a chat request are the client's (most often the replies it was served before).
What capture cannot write as such a record is dropped and counted as `unsupported`: batches, n > 1, token-id
prompts, non-text message parts, tool calls, echo. A record past the bounds `dspark train --data` reads
(MAX_LINE_BYTES a line, MAX_CONTENT_CHARS a message, MAX_MESSAGES; tests/integration/test_capture_records.py
checks them against models/training/conversations.py, which serving does not import) is dropped as `too_large`.
Redaction (`Redactor`) runs on every prompt, message and reply before the bounds are checked and the line is made.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import regex

from dspark.integration.capture_settings import REDACTED
from dspark.models.jsonl import MAX_LINE_BYTES

MAX_CONTENT_CHARS = 200_000  # ConversationLimits.max_content_chars
MAX_MESSAGES = 64  # ConversationLimits.max_messages
REDACT_TIMEOUT_S = 1.0  # the time all patterns get on one record; past it the record is dropped, never written raw
ROUTES = {"generate_request": "/generate", "openai_v1_completions": "/v1/completions",
          "openai_v1_chat_completions": "/v1/chat/completions"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SAMPLING_NAMES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "min_tokens":
                  "min_new_tokens"}  # OpenAI's names as SamplingParams'
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "min_new_tokens", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "seed", "n")


class Dropped(Exception):
    """The record is not written; `reason` is its label on dspark_capture_dropped_records_total."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason


@dataclass
class Exchange:
    """A captured request's body and its reply as served: the body chunks of a JSON reply, or the data of each
    server-sent event of a streamed one. Built on the event loop, read by the writer thread."""
    endpoint: str
    request: bytes
    streamed: bool = False
    incremental: bool = False  # a streamed /generate sends each chunk's new text, not the whole text so far
    reply: list[bytes] = field(default_factory=list)
    captured_at: float = field(default_factory=time.time)

    @property
    def size(self) -> int:
        return len(self.request) + sum(len(part) for part in self.reply)


class Redactor:
    """Every match of the patterns in a text replaced by [redacted]. The `regex` module releases the GIL while it
    matches (the HTTP process's event loop keeps running) and stops a match at its timeout."""

    def __init__(self, patterns: tuple[str, ...]):
        self.patterns = [regex.compile(pattern) for pattern in patterns]

    def __call__(self, text: str, deadline: float) -> str:
        for pattern in self.patterns:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                text = pattern.sub(REDACTED, text, timeout=left)
            except TimeoutError:
                raise Dropped("redaction_timeout", f"redaction took over {REDACT_TIMEOUT_S:g} s") from None
        return text


def events(exchange: Exchange) -> list[dict]:
    """The JSON events of a streamed reply ([DONE] and SGLang's error events left out)."""
    out = []
    for data in exchange.reply:
        if data.strip() != b"[DONE]":
            event = json.loads(data)
            if isinstance(event, dict) and "error" not in event:
                out.append(event)
    return out


def text_content(content: Any) -> str:
    """A message's content as the chat template gets it: a string, or text parts joined by a space (SGLang's
    flattening for string-format templates)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") in ("text", "input_text")
                                         and isinstance(part.get("text"), str) for part in content):
        return " ".join(part["text"] for part in content)
    raise Dropped("unsupported", "a message part that is not text")


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Dropped("unsupported", "messages is not a list")
    out = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES or message.get("tool_calls"):
            raise Dropped("unsupported", "a message with a role or tool calls a regenerate record cannot hold")
        out.append({"role": ROLES[message["role"]], "content": text_content(message.get("content"))})
    if not any(message["role"] == "user" for message in out):
        raise Dropped("unsupported", "no user turn")
    return out


def sampling(scope: Any) -> dict:
    """The sampling settings a request asked for, by SamplingParams' names."""
    if not isinstance(scope, dict):
        return {}
    named = {SAMPLING_NAMES.get(key, key): value for key, value in scope.items() if value is not None}
    return {key: named[key] for key in SAMPLING_KEYS if key in named}


def single(value: Any, what: str) -> Any:
    if isinstance(value, list):
        if len(value) != 1:
            raise Dropped("unsupported", f"{what}: {len(value)} of them")
        return value[0]
    return value


def generate_exchange(body: dict, exchange: Exchange) -> tuple[dict, str, Optional[str], Optional[int]]:
    """(the request's parts, reply, rid, completion_tokens) of /generate."""
    text, params = body.get("text"), body.get("sampling_params")
    if not isinstance(text, str) or not isinstance(params, (dict, type(None))) or sampling(params).get("n", 1) != 1:
        raise Dropped("unsupported", "a /generate request that is not one text prompt with one reply")
    if exchange.streamed:
        chunks = events(exchange)
        if not chunks:
            raise Dropped("unsupported", "a stream with no reply")
        reply = "".join(c.get("text") or "" for c in chunks) if exchange.incremental else chunks[-1].get("text")
        last = chunks[-1]
    else:
        last = single(json.loads(b"".join(exchange.reply)), "replies")
        reply = last.get("text")
    meta = last.get("meta_info") or {}
    parts = {"messages": [{"role": "user", "content": text}], "prompt": text, "sampling": sampling(params)}
    return parts, reply, meta.get("id"), meta.get("completion_tokens")


def openai_exchange(body: dict, exchange: Exchange, chat: bool) -> tuple[dict, str, Optional[str], Optional[int]]:
    """(the request's parts, reply, rid, completion_tokens) of /v1/completions or /v1/chat/completions."""
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1 or body.get("echo"):
        raise Dropped("unsupported", "n, best_of or echo")
    if chat:
        parts = {"messages": chat_messages(body)}
    else:
        prompt = single(body.get("prompt"), "prompts")
        if not isinstance(prompt, str):
            raise Dropped("unsupported", "a prompt that is not text")
        parts = {"messages": [{"role": "user", "content": prompt}], "prompt": prompt}
    parts["sampling"] = sampling(body)
    replies = events(exchange) if exchange.streamed else [json.loads(b"".join(exchange.reply))]
    texts, rid, tokens = [], None, None
    for reply in replies:
        rid = reply.get("id", rid)
        tokens = (reply.get("usage") or {}).get("completion_tokens", tokens)
        for choice in reply.get("choices") or []:
            if choice.get("index", 0) != 0:
                raise Dropped("unsupported", "more than one choice")
            said = (choice.get("delta") if exchange.streamed else choice.get("message")) if chat else choice
            if chat and said.get("tool_calls"):
                raise Dropped("unsupported", "a reply with tool calls")
            texts.append(said.get("content" if chat else "text") or "")
    return parts, "".join(texts), rid, tokens


def captured_record(exchange: Exchange, redact: Redactor, finished: Callable[[Optional[str]], Optional[tuple]],
                    models: Callable[[], dict]) -> dict:
    """The record of one exchange, without its index (module docstring); Dropped when it is not written.
    `finished(rid)`: (completion_tokens, spec_verify_ct) as SGLang counted them, None when unknown; `models()`:
    {"target": ..., "drafter": ...}."""
    try:
        body = json.loads(exchange.request)
        if not isinstance(body, dict):
            raise Dropped("unsupported", "a body that is not an object")
        if exchange.endpoint == "generate_request":
            parts, reply, rid, tokens = generate_exchange(body, exchange)
        else:
            parts, reply, rid, tokens = openai_exchange(body, exchange, exchange.endpoint ==
                                                        "openai_v1_chat_completions")
    except (ValueError, AttributeError, TypeError):  # a reply shaped otherwise than SGLang 0.5.23 answers
        raise Dropped("unsupported", "a reply this capture cannot read") from None
    if not isinstance(reply, str):
        raise Dropped("unsupported", "a reply with no text")
    deadline = time.monotonic() + REDACT_TIMEOUT_S
    messages = [{"role": m["role"], "content": redact(m["content"], deadline)} for m in parts["messages"]]
    messages.append({"role": "assistant", "content": redact(reply, deadline)})
    if len(messages) > MAX_MESSAGES or any(len(m["content"]) > MAX_CONTENT_CHARS for m in messages):
        raise Dropped("too_large", "more messages or longer ones than dspark train --data reads")
    counted = finished(rid)
    completion, verify = counted if counted is not None else (tokens, None)
    record = {"messages": messages, "reply_tokens": completion, "sampling": parts["sampling"],
              "route": ROUTES[exchange.endpoint], "stream": exchange.streamed, "captured_at": exchange.captured_at}
    if "prompt" in parts:
        record["prompt"] = messages[0]["content"]
    record["acceptance"] = {"completion_tokens": completion, "spec_verify_ct": verify,
                            "accepted_per_verify": completion / verify if completion and verify else None}
    return {**record, **models()}


def record_line(index: int, record: dict) -> bytes:
    """The JSONL line (index first, as regenerate writes it); Dropped past MAX_LINE_BYTES."""
    line = (json.dumps({"index": index, **record}, ensure_ascii=False) + "\n").encode("utf-8")
    if len(line) - 1 > MAX_LINE_BYTES:
        raise Dropped("too_large", f"a line of {len(line)} bytes")
    return line
