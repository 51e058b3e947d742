"""argparse types shared by every command.

`finite_float` is the type of every float flag: Python's float() takes "nan" and "inf", and a NaN compares
false with every bound, so `--admin-update-rate nan` used to switch the rate limit off. A non-finite value is
refused by argparse, naming the flag and the value.

`int_in(low, high)` types an integer flag with its bounds (`float_in`, a number's), so argparse refuses a value
outside them, naming the flag, the bound and the value, before a command starts any work. The shared ones: SEED
(torch and numpy take a seed up to 2**32 - 1; a larger one was a traceback after the model had loaded), PORT,
THREADS (torch's CPU threads: `--threads 100000` aborted the process), BATCH (requests or rows decoded together:
it multiplies every activation, and the vocabulary-wide logits, of the batch) and MAX_NEW_TOKENS.

`torch_device` types a --device flag: cpu, or a CUDA device this machine has (`--device foo` was a RuntimeError,
and `--device cuda` on a machine without one failed only after the weights were read).

`output_file` and `output_dir` type the flags a command writes to (--out, --json, --work-dir, ...): a path that is
not the wrong kind (a directory where a file goes, anything else where a directory goes) under a directory this
process may write, so a bad path is refused before the minutes of work whose results it was to hold. Commands still
create the missing folders below that directory.

`http_url` types a server address flag: http(s), a host, and a port in range if one is given (`--url foo` was an
AttributeError deep in a client, `http://h:99999` a ValueError).
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from urllib.parse import urlparse

import torch


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_in(low: int, high: int):
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {text[:40]}")
        return value
    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def float_in(low: float, high: float):
    """An argparse type: a finite number in [low, high]."""
    def parse(text: str) -> float:
        value = finite_float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low:g}, {high:g}], got {text[:40]}")
        return value
    parse.__name__ = f"number in [{low:g}, {high:g}]"
    return parse


SEED = int_in(0, 2**32 - 1)
PORT = int_in(1, 65535)
THREADS = int_in(1, 1024)
BATCH = int_in(1, 1024)
MAX_NEW_TOKENS = int_in(1, 1 << 20)  # the target's positions bound it further (decoding_args.check_max_new_tokens)


def http_url(text: str) -> str:
    """An argparse type: an http:// or https:// URL with a host (and a valid port, if given)."""
    try:
        parsed = urlparse(text)
        parsed.port  # noqa: B018 (raises ValueError when out of range or not a number)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"must be an http(s) URL with a valid port, got {text[:200]!r} ({err})"
                                         ) from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise argparse.ArgumentTypeError(f"must be an http(s) URL with a host, e.g. http://127.0.0.1:30000, got "
                                         f"{text[:200]!r}")
    return text


def torch_device(text: str) -> str:
    """An argparse type: "cpu", or "cuda" / "cuda:N" naming a CUDA device that is visible here."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text[:40]!r}") from None
    if device.type == "cpu":
        return text
    if device.type != "cuda":
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text[:40]!r}")
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of the {count} CUDA device(s) visible here")
    return text


MAX_PATH_CHARS = 4096  # Linux's PATH_MAX


def _writable_path(text: str, want_dir: bool) -> Path:
    if not text or len(text) > MAX_PATH_CHARS or "\0" in text:
        raise argparse.ArgumentTypeError(f"must be a path of 1 to {MAX_PATH_CHARS} characters, got {text[:80]!r}")
    path = Path(text)
    try:
        if path.exists():
            if want_dir != path.is_dir():
                raise argparse.ArgumentTypeError(f"{text[:200]!r} exists and is {'not ' if want_dir else ''}a "
                                                 "directory")
            if not os.access(path, os.W_OK):
                raise argparse.ArgumentTypeError(f"{text[:200]!r} is not writable by this process")
            return path
        ancestor = path.absolute().parent
        while not ancestor.exists():
            ancestor = ancestor.parent
    except OSError as err:  # a component over 255 bytes, a folder this process may not search, ...
        raise argparse.ArgumentTypeError(f"{text[:200]!r} cannot be used: {os.strerror(err.errno)}") from None
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text[:200]!r} cannot be created: {str(ancestor)[:200]!r} is not a "
                                         "directory this process may write")
    return path


def output_file(text: str) -> Path:
    """An argparse type: a file to write or append to (a regular file, or /dev/stdout, a pipe, ...: anything but a
    directory), or a path where one can be created."""
    return _writable_path(text, want_dir=False)


def output_dir(text: str) -> Path:
    """An argparse type: a directory to write into, or a path where one can be created."""
    return _writable_path(text, want_dir=True)
