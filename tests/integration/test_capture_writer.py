"""The capture writer (integration/capture_writer.py) and what the capture refuses (capture_settings.py): rotation,
the byte budget and age, drops counted when the queue is full, over budget or the disk fails, the folder it may
write to, the redaction patterns it takes, the middleware's opt-out and sampling (capture.py)."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
from collections import Counter

import pytest

from dspark.integration import capture, capture_writer
from dspark.integration.capture_records import Exchange
from dspark.integration.capture_settings import CaptureSettings, checked_folder
from dspark.integration.capture_writer import CaptureWriter
from dspark.models.errors import ConfigError
from dspark.models.training.regenerate import read_regenerated
from dspark.ops.cli import build_parser
from dspark.ops.commands.settings_args import values_from_args

MIB = 1 << 20
CONTENT = "y" * 150_000  # two of them make a line of about 300 KB: three fit in a 1 MiB file


def big_record(_exchange) -> dict:
    return {"messages": [{"role": "user", "content": CONTENT}, {"role": "assistant", "content": CONTENT}],
            "reply_tokens": 1, "sampling": {}}


def exchange(size: int = 10) -> Exchange:
    return Exchange("generate_request", b"x" * size)


class Writer:
    """A CaptureWriter on `folder` whose counts land in Counters; written synchronously unless started."""

    def __init__(self, folder, make_record=big_record, now: float = 1e9, **settings):
        self.counts = Counter()
        self.now = now
        values = {"capture": str(folder), "capture_file_bytes": MIB, "capture_max_bytes": 4 * MIB, **settings}
        self.writer = CaptureWriter(checked_folder(str(folder)), CaptureSettings(**values), make_record,
                                    lambda: self.counts.update(["written"]), lambda r: self.counts.update([r]),
                                    clock=lambda: self.now)

    def write(self, count: int) -> None:
        for _ in range(count):
            try:
                self.writer.write(exchange())
            except capture_writer.Dropped as dropped:
                self.counts.update([dropped.reason])


def files(folder) -> list:
    return sorted(folder.glob("capture-*.jsonl"))


def test_a_file_is_rotated_before_it_would_pass_capture_file_bytes(tmp_path):
    writer = Writer(tmp_path)
    writer.write(7)
    assert writer.counts == {"written": 7}
    sizes = [path.stat().st_size for path in files(tmp_path)]
    assert len(sizes) == 3 and all(size <= MIB for size in sizes)
    for path in files(tmp_path):  # each file starts at index 0 and reads as `dspark train --data` reads
        assert [json.loads(line)["index"] for line in path.read_text().splitlines()] == \
            list(range(len(read_regenerated(path))))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_past_capture_max_bytes_records_are_dropped_and_counted(tmp_path):
    writer = Writer(tmp_path, capture_max_bytes=MIB)
    writer.write(5)
    assert writer.counts == {"written": 3, "over_budget": 2}
    assert sum(path.stat().st_size for path in files(tmp_path)) <= MIB


def test_files_past_their_age_are_deleted_and_free_the_budget(tmp_path):
    old = tmp_path / "capture-old.jsonl"
    old.write_bytes(b"{}\n" * (MIB // 3))
    os.utime(old, (1e9 - 3601, 1e9 - 3601))
    kept = tmp_path / "notes.jsonl"  # not a capture file: never counted, never deleted
    kept.write_text("{}\n")
    writer = Writer(tmp_path, capture_max_bytes=MIB, capture_max_age_s=3600.0)
    assert writer.writer.total() == old.stat().st_size  # counted at start
    writer.write(1)
    assert writer.counts == {"written": 1} and not old.exists() and kept.exists()


def test_a_full_queue_drops_without_waiting_and_the_rest_is_written(tmp_path):
    writer = Writer(tmp_path, make_record=lambda e: {"messages": [{"role": "user", "content": "q"},
                                                                   {"role": "assistant", "content": "a"}]},
                    capture_queue_bytes=MIB)
    for _ in range(5):  # the thread has not started: nothing is taken off the queue
        writer.writer.offer(exchange(300_000))
    assert writer.counts == {"queue_full": 2}  # 3 x 300 KB fit in 1 MiB
    writer.writer.start().close()
    assert writer.counts == {"queue_full": 2, "written": 3}
    assert len(read_regenerated(files(tmp_path)[0])) == 3


def test_a_failed_write_leaves_whole_lines_and_counts_the_disk(tmp_path, monkeypatch):
    writer = Writer(tmp_path)
    writer.write(1)
    first = files(tmp_path)[0]
    size = first.stat().st_size
    real_write = os.write

    def half_then_full(fd, data):
        if fd != writer.writer.current:
            return real_write(fd, data)
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(capture_writer.os, "write", half_then_full)
    writer.write(1)
    monkeypatch.setattr(capture_writer.os, "write", real_write)
    assert writer.counts == {"written": 1, "disk_full": 1}
    assert first.stat().st_size == size and len(read_regenerated(first)) == 1
    writer.write(1)
    assert len(files(tmp_path)) == 2  # the next record starts a new file


def test_a_record_the_writer_fails_on_is_counted_and_the_thread_goes_on(tmp_path):
    made = iter([ValueError("bug"), big_record(None)])

    def make_record(_exchange):
        item = next(made)
        if isinstance(item, Exception):
            raise item
        return item

    writer = Writer(tmp_path, make_record=make_record)
    writer.writer.start()
    writer.writer.offer(exchange())
    writer.writer.offer(exchange())
    writer.writer.close()
    assert writer.counts == {"write_error": 1, "written": 1}


def test_the_folder_is_made_private_and_an_existing_one_narrowed(tmp_path):
    made = checked_folder(str(tmp_path / "a" / "capture"))
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    checked_folder(str(loose))
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700 and not list(loose.iterdir())  # the probe is gone


def test_a_folder_it_cannot_own_or_write_is_refused_naming_the_flag_and_path(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=f"--capture '{a_file}' is not a folder"):
        checked_folder(str(a_file))
    with pytest.raises(ConfigError, match=f"--capture '{a_file}/x': the folder cannot be made"):
        checked_folder(str(a_file / "x"))
    others = tmp_path / "others"
    others.mkdir()
    if os.geteuid() == 0:
        os.chown(others, 65534, 65534)
    else:
        others = tmp_path.anchor  # "/": root's
    with pytest.raises(ConfigError, match=r"is owned by uid \d+, not this user"):
        checked_folder(str(others))


@pytest.mark.parametrize("patterns, problem", [
    (("(a+)+b",), "nests a variable-length repeat"),
    (("(a|a)*",), "repeats an alternation"),
    (("x" * 300,), "it is 300 bytes, over 256"),
    (("(",), "not a valid regular expression"),
    (("a",) * 33, "at most 32 patterns, got 33"),
])
def test_redaction_patterns_are_bounded_as_hostile_input(patterns, problem):
    with pytest.raises(ConfigError, match=problem):
        CaptureSettings(capture_redact=patterns)


def test_the_flags_derive_from_the_settings_and_the_pattern_flag_repeats(monkeypatch):
    args = build_parser().parse_args(["serve", "--target", "t", "--no-spec", "--capture", "d", "--capture-redact",
                                      r"\d{4}", "--capture-redact", "a{2}", "b{2}", "--capture-rate", "0.25"])
    settings = values_from_args(args, CaptureSettings)
    assert settings == CaptureSettings(capture="d", capture_rate=0.25, capture_redact=(r"\d{4}", "a{2}", "b{2}"))
    monkeypatch.delenv(CaptureSettings.ENV_VAR, raising=False)
    assert CaptureSettings.from_env().capture is None  # off unless handed over
    monkeypatch.setenv(CaptureSettings.ENV_VAR, json.dumps({"capture": "d", "capture_redact": ["(a*)*"]}))
    with pytest.raises(ConfigError, match="capture_redact '\\(a\\*\\)\\*' is refused"):
        CaptureSettings.from_env()
    with pytest.raises(ConfigError, match="capture_max_bytes must be in capture_file_bytes"):
        CaptureSettings(capture_file_bytes=8 * MIB, capture_max_bytes=4 * MIB)


class Classify:
    def endpoint_name(self, scope):
        return {"/generate": "generate_request", "/health": "health"}.get(scope["path"])


class Offers:
    def __init__(self):
        self.offered, self.counts = [], Counter()

    def offer(self, exchange):
        self.offered.append(exchange)

    def dropped(self, reason):
        self.counts.update([reason])


def serve(middleware, path: str = "/generate", headers=(), status: int = 200, reply: bytes = b'{"text": "x"}'):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": reply, "more_body": False})

    async def receive():
        return {"type": "http.request", "body": b'{"text": "p"}', "more_body": False}

    async def send(_message):
        pass

    scope = {"type": "http", "method": "POST", "path": path, "headers": list(headers)}
    asyncio.run(middleware(app)(scope, receive, send))


def test_the_middleware_copies_answered_sampled_requests_and_honours_the_opt_out(monkeypatch):
    monkeypatch.setattr(capture, "incremental_streams", lambda: False)
    offers = Offers()
    middleware = lambda app: capture.TrafficCapture(app, Classify(), CaptureSettings(capture="d"), offers)
    serve(middleware)
    serve(middleware, headers=[(b"x-dspark-capture", b"OFF")])
    serve(middleware, path="/health")
    serve(middleware, status=400)
    assert [(e.request, e.reply) for e in offers.offered] == [(b'{"text": "p"}', [b'{"text": "x"}'])]
    serve(middleware, reply=b"x" * (capture.MAX_REPLY_BYTES + 1))
    assert offers.counts == {"too_large": 1} and len(offers.offered) == 1


def test_the_sampling_is_seeded_and_takes_the_rate(monkeypatch):
    monkeypatch.setattr(capture, "incremental_streams", lambda: False)

    def taken(seed: int) -> list[int]:
        offers = Offers()
        settings = CaptureSettings(capture="d", capture_rate=0.3, capture_seed=seed)
        middleware = capture.TrafficCapture(None, Classify(), settings, offers)
        for i in range(200):
            serve(lambda app: setattr(middleware, "app", app) or middleware, reply=json.dumps({"i": i}).encode())
        return [json.loads(e.reply[0])["i"] for e in offers.offered]

    assert taken(1) == taken(1) != taken(2)
    assert 40 <= len(taken(1)) <= 80
