"""The capture writer: a bounded queue the event loop hands captured exchanges to, and one thread that writes them.

The serving path only ever calls `offer`, which takes a lock held for a list append and never waits: an exchange
that would put more than capture_queue_bytes in the queue is dropped (`queue_full`). The thread turns each into a
record (capture_records.py) and appends it, one write() a line, to the folder's current file,
`capture-<UTC time>-<host>-<pid>-<n>.jsonl` (0600, created anew, never one another process writes: replicas
that share a folder on a claim have hosts of their own):

    rotation   a record that would take the current file past capture_file_bytes goes to a new file
    budget     the capture files in the folder (counted at start, then as written and deleted) take at most
               capture_max_bytes; a record past it is dropped (`over_budget`) once the files past their age are gone
    age        files last written more than capture_max_age_s ago are deleted, at start and every SWEEP_EVERY_S
    disk       a write that fails (a full disk: `disk_full`, any other error: `write_error`) is cut back off the
               file, so every file holds whole lines only, and the next record starts a new file

Each drop is counted under its reason (`dropped`), each record written (`written`): metrics.py's
dspark_capture_dropped_records_total{reason} and dspark_capture_records_total.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Optional

from dspark.integration.capture_records import Dropped, Exchange, record_line
from dspark.integration.capture_settings import CaptureSettings

FILE_GLOB = "capture-*.jsonl"
SWEEP_EVERY_S = 60.0
HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64]  # the pod's name in Kubernetes
logger = logging.getLogger(__name__)
REASONS = ("queue_full", "over_budget", "disk_full", "write_error", "too_large", "unsupported", "redaction_timeout")


class CaptureWriter:
    def __init__(self, folder: Path, settings: CaptureSettings, make_record: Callable[[Exchange], dict],
                 written: Callable[[], None], dropped: Callable[[str], None], clock: Callable[[], float] = time.time):
        self.folder, self.settings, self.make_record = folder, settings, make_record
        self.written, self.dropped, self.clock = written, dropped, clock
        self.pending: deque[Exchange] = deque()
        self.pending_bytes = 0
        self.ready = threading.Condition()
        self.closing = False
        self.sizes = {path.name: path.stat().st_size for path in folder.glob(FILE_GLOB)}
        self.current: Optional[int] = None  # the open file's descriptor
        self.current_name, self.current_size, self.index, self.files_opened = "", 0, 0, 0
        self.swept = -float("inf")
        self.thread = threading.Thread(target=self.run, name="dspark-capture-writer", daemon=True)

    def start(self) -> "CaptureWriter":
        self.thread.start()
        return self

    def offer(self, exchange: Exchange) -> None:
        """Queue an exchange for the writer; dropped at once when the queue is full (never waits)."""
        with self.ready:
            if self.pending_bytes + exchange.size > self.settings.capture_queue_bytes:
                self.dropped("queue_full")
                return
            self.pending.append(exchange)
            self.pending_bytes += exchange.size
            self.ready.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (for at most timeout_s), then stop the thread and close the file."""
        with self.ready:
            self.closing = True
            self.ready.notify()
        self.thread.join(timeout_s)

    def run(self) -> None:
        while True:
            with self.ready:
                while not self.pending and not self.closing:
                    self.ready.wait()
                if not self.pending:
                    break
                exchange = self.pending.popleft()
                self.pending_bytes -= exchange.size
            try:
                self.write(exchange)
            except Dropped as dropped:
                self.dropped(dropped.reason)
            except Exception:  # the thread must outlive any one record (the serving path would only see drops)
                logger.exception("dspark capture: a record could not be written")
                self.dropped("write_error")
        self.close_file()

    def write(self, exchange: Exchange) -> None:
        record = self.make_record(exchange)
        if self.clock() - self.swept >= SWEEP_EVERY_S:
            self.sweep()
        line = record_line(self.index, record)
        if self.current is not None and self.current_size + len(line) > self.settings.capture_file_bytes:
            self.close_file()
        if self.current is None:
            line = record_line(0, record)  # the first line of a new file
        if self.total() + len(line) > self.settings.capture_max_bytes:
            self.sweep()
            if self.total() + len(line) > self.settings.capture_max_bytes:
                raise Dropped("over_budget")
        if self.current is None:
            self.open_file()
        try:
            written = 0
            while written < len(line):
                written += os.write(self.current, line[written:])
        except OSError as err:
            try:
                os.ftruncate(self.current, self.current_size)  # whole lines only
            finally:
                self.close_file()
            raise Dropped(failed_write(err)) from None
        self.current_size += len(line)
        self.sizes[self.current_name] = self.current_size
        self.index += 1
        self.written()

    def total(self) -> int:
        return sum(self.sizes.values())

    def open_file(self) -> None:
        self.files_opened += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        self.current_name = f"capture-{stamp}-{HOST}-{os.getpid()}-{self.files_opened}.jsonl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.current = os.open(self.folder / self.current_name, flags, 0o600)
        except OSError as err:
            raise Dropped(failed_write(err)) from None
        self.current_size = self.index = 0
        self.sizes[self.current_name] = 0

    def close_file(self) -> None:
        if self.current is not None:
            os.close(self.current)
            self.current = None

    def sweep(self) -> None:
        """Delete the capture files last written more than capture_max_age_s ago (never the open one)."""
        self.swept = now = self.clock()
        for name in list(self.sizes):
            if name == self.current_name and self.current is not None:
                continue
            path = self.folder / name
            try:
                if now - path.stat().st_mtime > self.settings.capture_max_age_s:
                    path.unlink()
                    del self.sizes[name]
            except FileNotFoundError:  # deleted by someone else: no longer counted
                del self.sizes[name]
            except OSError:  # kept, and counted, until a later sweep can delete it
                pass


def failed_write(err: OSError) -> str:
    return "disk_full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "write_error"
