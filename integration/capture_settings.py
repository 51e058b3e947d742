"""Capture of served traffic (capture.py): its settings, their one definition, and the folder it may write to.

`dspark serve --capture DIR --capture-rate R ...` (ops/commands/settings_args.py derives the flags from
`CaptureSettings`), the chart's `capture` values (scripts/gen_chart_schema.py: every field but `capture`, which
the chart sets to the volume it mounts) and the JSON in DSPARK_CAPTURE that `dspark serve` hands to SGLang's HTTP
process, which checks it again where the plugin installs the capture (env_settings.py).

    capture                the folder (null: capture is off); made 0700 when missing, refused when it cannot be
                           written or is another user's (`checked_folder`)
    capture_rate           the share of requests to the captured routes that are captured, drawn per request
                           from a random generator seeded with capture_seed
    capture_max_bytes      the capture files in the folder take at most this; a record past it is dropped
    capture_file_bytes     a capture file is closed, and the next one started, before it would pass this
    capture_max_age_s      capture files last written longer ago than this are deleted
    capture_queue_bytes    the requests and replies waiting for the writer thread take at most this in memory;
                           a reply past it is dropped (the serving path never waits for the disk)
    capture_redact         regular expressions whose matches are written as [redacted], in prompts and replies;
                           hostile input too: each at most MAX_STOP_REGEX_BYTES and refused when shaped for
                           catastrophic backtracking (stop_regex.py's check), and each match given
                           REDACT_TIMEOUT_S per record by the writer
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dspark.integration.env_settings import EnvSettings
from dspark.integration.stop_regex import unsafe_reason
from dspark.models.decoding.settings import setting
from dspark.models.errors import ConfigError, shown

MAX_REDACT_PATTERNS = 32
REDACTED = "[redacted]"


@dataclass(frozen=True)
class CaptureSettings(EnvSettings):
    ENV_VAR = "DSPARK_CAPTURE"
    capture: Optional[str] = setting(None, "folder served replies are captured to as JSONL (null: no capture)", str,
                                     nullable=True)
    capture_rate: float = setting(1.0, "share of requests captured (seeded random sampling)", float, low=0, high=1)
    capture_seed: int = setting(0, "seed of the capture sampling", int, low=0, high=(1 << 63) - 1)
    capture_file_bytes: int = setting(64 << 20, "bytes of one capture file; the next record starts a new file",
                                      int, low=1 << 20, high=1 << 34)
    capture_max_bytes: int = setting(1 << 30, "bytes all capture files may take; past it records are dropped "
                                     "(counted)", int, low="capture_file_bytes", high=1 << 42)
    capture_max_age_s: float = setting(7 * 86400.0, "seconds a capture file is kept after it was last written",
                                       float, low=60.0, high=366 * 86400.0)
    capture_queue_bytes: int = setting(64 << 20, "bytes of captured requests waiting for the writer; past it they "
                                       "are dropped (counted)", int, low=1 << 20, high=1 << 34)
    capture_redact: Optional[tuple[str, ...]] = setting(None, "regular expression whose matches are written as "
                                                        f"{REDACTED} (one or more; repeatable)", str,
                                                        nullable=True, per_position=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        patterns = self.capture_redact or ()
        if len(patterns) > MAX_REDACT_PATTERNS:
            raise ConfigError(f"capture_redact may hold at most {MAX_REDACT_PATTERNS} patterns, got {len(patterns)}")
        for pattern in patterns:
            reason = unsafe_reason(pattern)
            if reason:
                raise ConfigError(f"capture_redact {shown(pattern)} is refused: {reason}")


def checked_folder(path: str) -> Path:
    """The capture folder as this user's own private, writable folder (made 0700 when missing, an existing one of
    ours narrowed to 0700); a ConfigError naming --capture and the path when it cannot be."""
    folder = Path(path).expanduser().absolute()
    where = f"--capture {shown(str(folder))}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = folder.stat()
    except FileExistsError:  # something that is not a folder
        raise ConfigError(f"{where} is not a folder") from None
    except OSError as err:
        raise ConfigError(f"{where}: the folder cannot be made ({os.strerror(err.errno or 0)})") from None
    if found.st_uid != os.geteuid():
        raise ConfigError(f"{where} is owned by uid {found.st_uid}, not this user (uid {os.geteuid()}): captured "
                          "traffic is written only to a folder of this user's own (name a folder inside it)")
    probe = folder / f".write-check-{os.getpid()}"
    try:
        if stat.S_IMODE(found.st_mode) != 0o700:
            folder.chmod(0o700)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{where}: the folder cannot be written ({os.strerror(err.errno or 0)})") from None
    return folder
