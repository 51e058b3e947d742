"""Conversations files: the three layouts read to the same messages, hostile records refused by name, and the
skeleton of replies the target fills in."""
import json

import pytest

from dspark.models.errors import ConfigError
from dspark.models.training.conversations import (ConversationLimits, conversation_from_record, parse_record,
                                                  read_conversations, reply_skeleton)

USER, REPLY = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "old reply"}


def parse_conversation(line: str, where: str, limits: ConversationLimits = ConversationLimits()):
    """One JSONL line as `dspark regenerate` and `dspark train --data` read it: parsed, bounded, its messages."""
    return conversation_from_record(parse_record(line, where, limits), where, limits)


@pytest.mark.parametrize("record", [
    {"messages": [USER, REPLY]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "old reply"}]},
])
def test_sharegpt_and_openai_layouts_read_the_same(record):
    assert parse_conversation(json.dumps(record), "f:1") == [USER, REPLY]


def test_plain_prompts_are_user_turns():
    assert parse_conversation('{"prompt": "hi"}', "f:1") == [USER]
    assert parse_conversation('{"turns": ["hi", "more"]}', "f:1") == [USER, {"role": "user", "content": "more"}]


@pytest.mark.parametrize("line, named", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"text": "hi"}', '"messages"'),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "role='robot'"),
    ('{"messages": [{"role": "user", "content": 3}]}', "message 0 content must be a string"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "no user turn"),
    ('{"turns": "hi"}', "turns must be a list"),
    ('{"messages": [{"role": ["user"], "content": "x"}]}', "role=\"['user']\""),
    ('{"conversations": [{"from": {"a": 1}, "value": "x"}]}', "from=\"{'a': 1}\""),
    ('{"prompt": "a\\ud800b"}', "prompt holds a lone surrogate at character 1"),
    ('{"prompt": 1' + "0" * 5000 + "}", "not JSON this reader takes"),
    ("[" * 100_000, "not JSON this reader takes"),
])
def test_bad_records_are_refused_by_name(line, named):
    with pytest.raises(ConfigError, match="f:7") as error:
        parse_conversation(line, "f:7")
    assert named in str(error.value)


def test_bounds_name_the_field_the_bound_and_the_value():
    limits = ConversationLimits(max_messages=2, max_content_chars=5)
    with pytest.raises(ConfigError, match="number of messages is 3, above the bound 2"):
        parse_conversation(json.dumps({"messages": [USER, REPLY, USER]}), "f:1", limits)
    with pytest.raises(ConfigError, match="length of prompt is 6, above the bound 5"):
        parse_conversation('{"prompt": "sixsix"}', "f:1", limits)
    with pytest.raises(ConfigError, match="size in bytes is 16, above the bound 10"):
        parse_conversation('{"prompt": "hi"}', "f:1", ConversationLimits(max_line_bytes=10))


def test_a_file_is_read_a_bounded_line_at_a_time_and_must_be_utf8(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n' + b"x" * 50)
    with pytest.raises(ConfigError, match="in.jsonl:2: the line's size in bytes is at least 22, above the bound 20"):
        read_conversations(path, ConversationLimits(max_line_bytes=20))
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ConfigError, match=r"in.jsonl:2: not UTF-8 \(byte 12\)"):
        read_conversations(path)


def test_a_limit_reads_the_file_no_further(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": 5}\n')
    assert read_conversations(path, limit=2) == [[{"role": "user", "content": c}] for c in "ab"]
    with pytest.raises(ConfigError, match=r"in.jsonl:4: prompt must be a string"):
        read_conversations(path, limit=3)


def test_a_file_names_its_bad_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": 5}\n')
    with pytest.raises(ConfigError, match=r"in.jsonl:3: prompt must be a string"):
        read_conversations(path)


def test_every_assistant_turn_becomes_an_empty_slot_and_a_final_user_turn_gets_one():
    system = {"role": "system", "content": "s"}
    skeleton = reply_skeleton([system, USER, REPLY, REPLY, {"role": "user", "content": "next"}])
    empty = {"role": "assistant", "content": ""}
    assert skeleton == [system, USER, empty, {"role": "user", "content": "next"}, empty]
    assert reply_skeleton([REPLY, USER]) == [USER, empty], "a reply with no user turn before it is dropped"
