"""Conversations from local JSONL files, in the three common layouts, read as hostile input.

One record a line, in any of:

- ShareGPT: {"conversations": [{"from": "human" | "gpt" | "system", "value": "..."}, ...]}
  ("user"/"assistant" and "chatgpt"/"bard" are accepted as the same roles);
- OpenAI messages: {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]};
- plain prompts: {"prompt": "..."} or {"turns": ["...", ...]} (the evaluation sets' layout): user turns only.

Each becomes a list of {"role", "content"} messages. What the target regenerates is every assistant turn; a
conversation's given assistant turns only mark where a reply goes, their text is never kept (`reply_skeleton`). A
conversation that ends on a user turn gets a reply there too, so a plain prompt yields one reply per user turn.

Every line and field is bounded (`ConversationLimits`); a record outside a bound is refused with its line number,
the field, the bound and the value, before anything is generated.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from dspark.models.errors import ConfigError
from dspark.models.jsonl import MAX_LINE_BYTES, bounded_lines, parse_json_line

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
                  "assistant": "assistant", "system": "system"}
Message = dict[str, str]


class Conversation(NamedTuple):
    """A conversation read from a file, with where it was read (`path:line`) to name it in later errors."""
    where: str
    messages: list[Message]


@dataclass(frozen=True)
class ConversationLimits:
    """Bounds on an input file's records."""

    max_line_bytes: int = MAX_LINE_BYTES
    max_messages: int = 64
    max_content_chars: int = 200_000
    max_records: int = 10_000_000


def _bounded(value, bound: int, what: str, where: str) -> None:
    if value > bound:
        raise ConfigError(f"{where}: {what} is {value}, above the bound {bound}")


def _text(value, field: str, where: str, limits: ConversationLimits) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {field} must be a string, got {type(value).__name__}")
    _bounded(len(value), limits.max_content_chars, f"the length of {field}", where)
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer or UTF-8 writer takes
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigError(f"{where}: {field} holds a lone surrogate at character {error.start}") from None
    return value


def _messages(record: dict, where: str, limits: ConversationLimits) -> list[Message]:
    if "messages" in record:
        items, role_key, text_key, roles = record["messages"], "role", "content", {r: r for r in ROLES}
    elif "conversations" in record:
        items, role_key, text_key, roles = record["conversations"], "from", "value", SHAREGPT_ROLES
    elif "prompt" in record:
        return [{"role": "user", "content": _text(record["prompt"], "prompt", where, limits)}]
    elif "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list):
            raise ConfigError(f"{where}: turns must be a list of strings")
        _bounded(len(turns), limits.max_messages, "the number of turns", where)
        return [{"role": "user", "content": _text(t, f"turns[{i}]", where, limits)} for i, t in enumerate(turns)]
    else:
        raise ConfigError(f"{where}: needs one of \"messages\" (OpenAI), \"conversations\" (ShareGPT), \"prompt\" "
                          "or \"turns\"")
    if not isinstance(items, list):
        raise ConfigError(f"{where}: the conversation must be a list of messages")
    _bounded(len(items), limits.max_messages, "the number of messages", where)
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: message {i} must be an object")
        role = item.get(role_key)
        if not isinstance(role, str) or role not in roles:
            raise ConfigError(f"{where}: message {i} has {role_key}={str(role)[:40]!r}; one of {sorted(roles)}")
        messages.append({"role": roles[role], "content": _text(item.get(text_key), f"message {i} {text_key}", where,
                                                               limits)})
    return messages


def parse_record(line: str | bytes, where: str, limits: ConversationLimits = ConversationLimits()):
    """One JSONL line as JSON, its size bounded; ConfigError names `where`."""
    return parse_json_line(line, where, limits.max_line_bytes)


def jsonl_records(path: Path, what: str, limits: ConversationLimits = ConversationLimits()):
    """(where, record) for each non-blank line of a JSONL file, parsed and bounded; `what` names the file in errors
    (a flag, say)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist")
    count = 0
    for number, line in bounded_lines(path, limits.max_line_bytes):
        if line.strip():
            count += 1
            _bounded(count, limits.max_records, "the number of records", str(path))
            where = f"{path}:{number}"
            yield where, parse_record(line, where, limits)
    if not count:
        raise ConfigError(f"{what} {path} has no records")


def conversation_from_record(record, where: str, limits: ConversationLimits = ConversationLimits()) -> list[Message]:
    """The messages of one parsed record, checked against the limits."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a record must be a JSON object")
    messages = _messages(record, where, limits)
    if not any(m["role"] == "user" for m in messages):
        raise ConfigError(f"{where}: has no user turn to reply to")
    return messages


def read_conversations(path: Path, limits: ConversationLimits = ConversationLimits(),
                       limit: int | None = None) -> list[list[Message]]:
    """The first `limit` conversations of a JSONL file (None: every one), in file order (blank lines skipped); the
    file is read no further than that."""
    records = itertools.islice(jsonl_records(path, "conversations file", limits), limit)
    return [conversation_from_record(record, where, limits) for where, record in records]


def reply_skeleton(messages: list[Message]) -> list[Message]:
    """The conversation the target fills in: its system and user turns, with an empty assistant turn after each
    user turn that had a reply, and after the last one. Given assistant texts are dropped (the target writes its
    own, each conditioned on its own earlier replies); an assistant turn with no user turn before it is dropped."""
    skeleton: list[Message] = []
    for message in messages:
        if message["role"] != "assistant":
            skeleton.append(dict(message))
        elif skeleton and skeleton[-1]["role"] == "user":
            skeleton.append({"role": "assistant", "content": ""})
    if skeleton[-1]["role"] == "user":
        skeleton.append({"role": "assistant", "content": ""})
    return skeleton
