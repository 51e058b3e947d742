"""User-facing errors.

Every error a user can cause (a malformed or mismatched checkpoint, an invalid setting, a missing file)
is a `DsparkError` whose message names the field, the rule, the value seen and the fix. The CLI prints
these as one line; anything else is a bug and keeps its traceback.

A value echoed in a message goes through `shown`: a caller may send a megabyte, and the message travels on to
`/server_info` (`last_rejection`), gRPC details and the admin audit log, so it keeps the head that fits in
SHOWN_CHARS characters of JSON and says how long the whole was (`clipped`, which the audit log uses too).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

SHOWN_CHARS = 200


class DsparkError(Exception):
    """Base class of errors caused by bad input rather than by a bug."""


class CheckpointError(DsparkError):
    """A checkpoint is missing, malformed, or does not fit the target it is used with."""


class ConfigError(DsparkError):
    """A setting is out of range or inconsistent with another."""


def clipped(text: str, limit: int, digest: bool = False) -> str:
    """`text` when it takes at most `limit` characters written as JSON (where a non-ASCII or control character
    takes up to 6), else the head that does, followed by how many characters the whole had (and, with `digest`,
    its sha256, so that two clipped values can still be told apart or matched)."""
    if escaped_length(text) <= limit:
        return text
    kept = used = 0
    for character in text[:limit]:
        used += escaped_length(character)
        if used > limit:
            break
        kept += 1
    whole = f", sha256:{hashlib.sha256(text.encode(errors='surrogatepass')).hexdigest()}" if digest else ""
    return f"{text[:kept]}... ({len(text)} chars{whole})"


def escaped_length(text: str) -> int:
    return len(json.dumps(text)) - 2


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for an error message, clipped to `limit` characters."""
    return clipped(repr(value), limit)
