"""What `dspark train --data PATH` reads: one `dspark regenerate` output file, or a folder of them (a `dspark serve
--capture` folder: every `*.jsonl` file in it, in name order, each read as regenerate's records), and the held-out
slice of those conversations that training never sees.

The held-out slice is the rule every chat split uses (documents.py): a conversation is held out when the sha256 of
its first user turn falls in the lowest --held-out-percent of 100 buckets, so the slice depends on the text alone,
never on the order, the file or the run, and a prompt asked again in a later capture stays on its side of the split.
`write_held_out` writes the slice's prompts beside the exported drafter as a `{"turns": [...]}` file, which `dspark
eval --datasets` reads as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from dspark.models.embedded_target.corpus import is_held_out
from dspark.models.errors import ConfigError
from dspark.models.training.conversations import Conversation
from dspark.models.training.regenerate import read_regenerated

MAX_DATA_FILES = 100_000  # a capture folder at its default 64 MiB a file holds 16 of them a GiB
HELD_OUT_FILE = "held_out.jsonl"


def data_files(path: Path) -> list[Path]:
    """The files `--data path` names: the file itself, or a folder's `*.jsonl` files (plain files, not links) in name
    order; ConfigError naming --data and the path when there is none, or more than MAX_DATA_FILES."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"--data {path} is neither a file nor a folder")
    files = sorted(p for p in path.glob("*.jsonl") if p.is_file() and not p.is_symlink())
    if not files:
        raise ConfigError(f"--data {path}: the folder holds no *.jsonl file")
    if len(files) > MAX_DATA_FILES:
        raise ConfigError(f"--data {path}: {len(files)} *.jsonl files, above the bound {MAX_DATA_FILES}")
    return files


def read_data(path: Path) -> list[Conversation]:
    """Every conversation of every file of `--data path`, file by file (each checked as hostile input and named by
    its file and line; indices are a file's own, as a capture file numbers its records from 0)."""
    return [conversation for file in data_files(path) for conversation in read_regenerated(file)]


def data_key(path: Path) -> dict:
    """The data cache's key part for `--data path`: the file's sha256, or the folder's files' names and sha256s."""
    def digest(file: Path) -> str:
        with file.open("rb") as handle:  # in chunks: a file is never held twice in memory
            return hashlib.file_digest(handle, "sha256").hexdigest()

    if path.is_file():
        return {"data_file_sha256": digest(path)}
    listing = "\n".join(f"{file.name}\0{digest(file)}" for file in data_files(path))
    return {"data_folder_sha256": hashlib.sha256(listing.encode()).hexdigest()}


def first_user_turns(conversations: list[Conversation]) -> list[str]:
    """The first user turn of each conversation: what splits the data train / held-out, and what the held-out
    check prompts the target with."""
    return [next(m["content"] for m in c.messages if m["role"] == "user") for c in conversations]


def split_conversations(conversations: list[Conversation], held_out_percent: int
                        ) -> tuple[list[Conversation], list[str]]:
    """(the conversations trained on, the held-out slice's first user turns, each once in the data's order)."""
    train, held_out = [], []
    for conversation, text in zip(conversations, first_user_turns(conversations)):
        if is_held_out(text, held_out_percent):
            held_out.append(text)
        else:
            train.append(conversation)
    return train, list(dict.fromkeys(held_out))


def write_held_out(prompts: list[str], directory: Path) -> Path:
    """The held-out prompts as `{"turns": [prompt]}` lines in directory/HELD_OUT_FILE, 0600: they are the captured
    users' own text, as private as the capture folder's files."""
    path = directory / HELD_OUT_FILE
    path.unlink(missing_ok=True)  # a file left by an earlier run keeps its mode: made anew, 0600
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as sink:
        for prompt in prompts:
            sink.write(json.dumps({"turns": [prompt]}, ensure_ascii=False) + "\n")
    return path
