"""A captured exchange as a `dspark regenerate` record (integration/capture_records.py): what each route's reply
becomes, streamed or not, what is dropped and why, redaction, and that `dspark train --data` reads the file."""
from __future__ import annotations

import json
import time

import pytest
from transformers import AutoTokenizer

from dspark.integration import capture_records
from dspark.integration.capture_records import (Dropped, Exchange, Redactor, captured_record, record_line)
from dspark.models.jsonl import MAX_LINE_BYTES
from dspark.models.training.conversation_data import conversation_sample
from dspark.models.training.conversations import ConversationLimits
from dspark.models.training.regenerate import RECORD_START, read_regenerated

from tests.paths import EMBEDDED_TARGET

MODELS = {"target": {"path": "/models/t", "sha256": "ab" * 32}, "drafter": None}
COUNTS = {"rid-1": (9, 4)}


def record(exchange: Exchange, patterns: tuple[str, ...] = (), counts: dict = COUNTS) -> dict:
    return captured_record(exchange, Redactor(patterns), counts.get, lambda: MODELS)


def sse(*events: dict) -> list[bytes]:
    return [json.dumps(event).encode() for event in events]


def chat(content, **fields) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": content}], **fields}).encode()


def test_the_bounds_are_those_train_reads():
    limits = ConversationLimits()
    assert (capture_records.MAX_CONTENT_CHARS, capture_records.MAX_MESSAGES, MAX_LINE_BYTES) == \
        (limits.max_content_chars, limits.max_messages, limits.max_line_bytes)


def test_a_generate_reply_with_its_sampling_and_live_acceptance():
    body = {"text": "def f(", "sampling_params": {"temperature": 0, "max_new_tokens": 9, "top_k": None}}
    reply = {"text": " x):", "meta_info": {"id": "rid-1", "completion_tokens": 9}}
    out = record(Exchange("generate_request", json.dumps(body).encode(), reply=[json.dumps(reply).encode()]))
    assert out["messages"] == [{"role": "user", "content": "def f("}, {"role": "assistant", "content": " x):"}]
    assert out["prompt"] == "def f(" and out["route"] == "/generate" and out["stream"] is False
    assert out["sampling"] == {"temperature": 0, "max_new_tokens": 9}
    assert out["reply_tokens"] == 9
    assert out["acceptance"] == {"completion_tokens": 9, "spec_verify_ct": 4, "accepted_per_verify": 2.25}
    assert out["target"] == MODELS["target"] and out["drafter"] is None
    line = record_line(3, out)
    assert line.startswith(RECORD_START + b"3,") and line.endswith(b"\n")


def test_without_the_servers_counts_the_replys_own_count_and_no_verify_rounds():
    reply = {"text": "a", "meta_info": {"id": "rid-unknown", "completion_tokens": 1}}
    out = record(Exchange("generate_request", b'{"text": "p"}', reply=[json.dumps(reply).encode()]))
    assert out["acceptance"] == {"completion_tokens": 1, "spec_verify_ct": None, "accepted_per_verify": None}


def test_streams_are_assembled_cumulative_or_incremental():
    body = b'{"text": "p", "stream": true}'
    cumulative = sse({"text": "a", "meta_info": {"id": "rid-1"}}, {"text": "ab", "meta_info": {"id": "rid-1"}})
    assert record(Exchange("generate_request", body, streamed=True, reply=cumulative))["messages"][-1][
        "content"] == "ab"
    increments = sse({"text": "a", "meta_info": {"id": "rid-1"}}, {"text": "b", "meta_info": {"id": "rid-1"}})
    assert record(Exchange("generate_request", body, streamed=True, incremental=True, reply=increments))[
        "messages"][-1]["content"] == "ab"
    chunks = sse({"id": "rid-1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                 {"id": "rid-1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
                 {"id": "rid-1", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
                 {"id": "rid-1", "choices": [], "usage": {"completion_tokens": 9}})
    out = record(Exchange("openai_v1_chat_completions", chat("hi", stream=True), streamed=True, reply=chunks))
    assert out["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "Hello"}]
    assert out["stream"] is True and out["acceptance"]["spec_verify_ct"] == 4 and "prompt" not in out
    completion = sse({"id": "rid-1", "choices": [{"index": 0, "text": "1 + "}]},
                     {"id": "rid-1", "choices": [{"index": 0, "text": "1"}]})
    out = record(Exchange("openai_v1_completions", b'{"prompt": "1 + 1 = ", "max_tokens": 4}', streamed=True,
                          reply=completion))
    assert out["messages"][-1]["content"] == "1 + 1" and out["sampling"] == {"max_new_tokens": 4}


def test_text_parts_are_joined_as_sglang_flattens_them():
    reply = sse({"id": "x", "choices": [{"index": 0, "message": {"content": "ok"}}]})
    out = record(Exchange("openai_v1_chat_completions", chat([{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]), reply=reply))
    assert out["messages"][1]["content"] == "a b"


@pytest.mark.parametrize("endpoint, body, reply", [
    ("generate_request", b'{"text": ["a", "b"]}', b'[{"text": "x"}, {"text": "y"}]'),  # a batch
    ("generate_request", b'{"input_ids": [1, 2]}', b'{"text": "x"}'),
    ("generate_request", b'{"text": "a", "sampling_params": {"n": 2}}', b'[{"text": "x"}, {"text": "y"}]'),
    ("openai_v1_completions", b'{"prompt": "a", "echo": true}', b'{"choices": [{"text": "ax"}]}'),
    ("openai_v1_completions", b'{"prompt": [1, 2]}', b'{"choices": [{"text": "x"}]}'),
    ("openai_v1_chat_completions", chat([{"type": "image_url", "image_url": {"url": "u"}}]),
     b'{"choices": [{"message": {"content": "x"}}]}'),
    ("openai_v1_chat_completions", chat("a", n=2), b'{"choices": [{"index": 0, "message": {"content": "x"}}]}'),
    ("openai_v1_chat_completions", chat("a"), b'{"choices": [{"message": {"content": null, "tool_calls": [{}]}}]}'),
    ("openai_v1_chat_completions", b'{"messages": [{"role": "tool", "content": "r"}]}',
     b'{"choices": [{"message": {"content": "x"}}]}'),
    ("openai_v1_chat_completions", b'{"messages": [{"role": "system", "content": "s"}]}',
     b'{"choices": [{"message": {"content": "x"}}]}'),  # no user turn: train would refuse it
    ("generate_request", b'{"text": "a"}', b'{"text": "x"'),  # a reply cut short
])
def test_what_a_regenerate_record_cannot_hold_is_dropped_as_unsupported(endpoint, body, reply):
    with pytest.raises(Dropped) as dropped:
        record(Exchange(endpoint, body, reply=[reply]))
    assert dropped.value.reason == "unsupported"


def test_redaction_covers_prompts_messages_and_replies_before_anything_is_written():
    body = chat("call 555-0199 or mail a@b.example", max_tokens=4)
    reply = b'{"id": "x", "choices": [{"index": 0, "message": {"content": "555-0199 noted"}}]}'
    out = record(Exchange("openai_v1_chat_completions", body, reply=[reply]), (r"\d{3}-\d{4}", r"\w+@[\w.]{1,64}"))
    assert [m["content"] for m in out["messages"]][1:] == ["call [redacted] or mail [redacted]", "[redacted] noted"]
    raw = record(Exchange("generate_request", b'{"text": "id 555-0199"}', reply=[b'{"text": "ok"}']),
                 (r"\d{3}-\d{4}",))
    assert raw["prompt"] == "id [redacted]" == raw["messages"][0]["content"]


def test_redaction_past_its_time_drops_the_record_instead_of_writing_it_raw():
    with pytest.raises(Dropped) as dropped:
        Redactor((r"\d{1,9}x",))("1" * 10_000, deadline=time.monotonic() - 1)
    assert dropped.value.reason == "redaction_timeout"


def test_records_past_what_train_reads_are_dropped_as_too_large():
    long = "x" * (capture_records.MAX_CONTENT_CHARS + 1)
    with pytest.raises(Dropped) as dropped:
        record(Exchange("generate_request", json.dumps({"text": long}).encode(), reply=[b'{"text": "ok"}']))
    assert dropped.value.reason == "too_large"
    wide = {"messages": [{"role": "user", "content": "\u4e00" * 190_000}] * 2}  # 3 bytes a character
    with pytest.raises(Dropped, match="a line of"):
        record_line(0, wide)


def test_train_reads_a_capture_file_as_it_reads_regenerates_output(tmp_path):
    replies = [(b'{"text": "def f("}', b'{"text": " x):\\n    return x", "meta_info": {"id": "rid-1"}}'),
               (chat("hello"), b'{"id": "r2", "choices": [{"index": 0, "message": {"content": "Hi there"}}]}')]
    path = tmp_path / "capture-1.jsonl"
    path.write_bytes(b"".join(record_line(i, record(Exchange(endpoint, body, reply=[reply])))
                              for i, (endpoint, (body, reply)) in
                              enumerate(zip(("generate_request", "openai_v1_chat_completions"), replies))))
    conversations = read_regenerated(path)
    assert [c.messages[-1]["content"] for c in conversations] == [" x):\n    return x", "Hi there"]
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    sample = conversation_sample(tokenizer, conversations[1].messages, 32, 16, tokenizer.eos_token_id or 0,
                                 conversations[1].where)
    assert sample.loss_mask.sum() > 0  # the served reply is what it trains on
