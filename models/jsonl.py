"""JSON and JSONL files read as hostile input. A JSONL file is read a bounded line at a time (a file with no
newline is refused at the bound, not read whole), UTF-8 checked, and every parse error is a ConfigError that names
the file and line. A whole JSON file (`read_json_file`) must be a regular file under a size bound."""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from dspark.models.errors import ConfigError, DsparkError

MAX_LINE_BYTES = 1 << 20


def read_json_file(path: Path | str, where: str, kind: str, max_bytes: int,
                   error: type[DsparkError] = ConfigError, how_to_make: str = ""):
    """The JSON value of a whole file: a regular file (a FIFO or a device would block or never end) of at most
    max_bytes, UTF-8. Every failure is an `error` naming `where` and what the file is not (`kind`), never the file's
    contents or the parser's positions: some of these messages are served back to a remote caller. A missing file's
    message ends with `how_to_make` (e.g. the command that writes one)."""
    try:
        path = Path(path)
        if not path.is_file():
            raise error(f"{where} does not exist or is not a file{f' ({how_to_make})' if how_to_make else ''}")
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as err:  # ENAMETOOLONG, EACCES, ...
        raise error(f"{where} cannot be read: {os.strerror(err.errno) if err.errno else type(err).__name__}"
                    ) from None
    if len(raw) > max_bytes:
        raise error(f"{where} is over {max_bytes} bytes: not {kind}")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # UTF-8 and JSON errors, over-long integers, nesting too deep
        raise error(f"{where} is not {kind} ({type(err).__name__})") from None


def bounded_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES):
    """(line number, the line's bytes with its newline if it has one), never more than one bounded line in memory."""
    with Path(path).open("rb") as handle:
        for number in itertools.count(1):
            line = handle.readline(max_line_bytes + 2)
            if not line:
                return
            size = len(line.rstrip(b"\r\n"))
            if size > max_line_bytes:
                cut = "" if line.endswith(b"\n") else "at least "
                raise ConfigError(f"{path}:{number}: the line's size in bytes is {cut}{size}, above the bound "
                                  f"{max_line_bytes}")
            yield number, line


def parse_json_line(line: str | bytes, where: str, max_line_bytes: int = MAX_LINE_BYTES):
    """One line (text, or bytes that must be UTF-8) as JSON, its size bounded; ConfigError names `where`."""
    raw = line if isinstance(line, bytes) else line.encode(errors="surrogatepass")
    size = len(raw.rstrip(b"\r\n"))
    if size > max_line_bytes:
        raise ConfigError(f"{where}: the line's size in bytes is {size}, above the bound {max_line_bytes}")
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
    except UnicodeDecodeError as error:
        raise ConfigError(f"{where}: not UTF-8 (byte {error.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}: not valid JSON ({error.msg})") from None
    except (ValueError, RecursionError) as error:  # an integer of over 4300 digits; arrays nested too deep
        raise ConfigError(f"{where}: not JSON this reader takes ({str(error)[:80]})") from None


def appended_records(path: Path, record_start: bytes, kind: str, max_line_bytes: int = MAX_LINE_BYTES):
    """(where, parsed record) for each complete line of an --out file a command appends records to, and that a
    killed writer may have left with a cut last line. Once the caller has taken every complete line (checking each as
    one of its own), a cut last line that starts as every record does (`record_start`) is dropped, so appending
    stays valid; any other unterminated line is refused as not `kind`. A caller that raises leaves the file as it
    was. A missing file yields nothing."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_file():
        raise ConfigError(f"--out {path} is not a file")
    complete, cut = 0, False
    for number, line in bounded_lines(path, max_line_bytes):
        where = f"{path}:{number}"
        if not line.endswith(b"\n"):
            if not line.startswith(record_start):
                raise ConfigError(f"{where} is not {kind}; write to a new --out")
            cut = True
            break
        complete += len(line)
        yield where, parse_json_line(line, where, max_line_bytes)
    if cut:
        with path.open("r+b") as handle:
            handle.truncate(complete)
