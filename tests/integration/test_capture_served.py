"""Capture of served traffic on the real server: the session's shared `dspark serve` captures every reply
(tests/integration/conftest.py passes --capture, --capture-rate 1.0 and a --capture-redact pattern). Requests with
prompts of their own are found again in the capture folder: the served reply, the live acceptance, redaction,
and the opt-out header; /metrics counts the records."""
from __future__ import annotations

import json
import re
import stat
import time
import urllib.request
import uuid
from pathlib import Path

from dspark.models.training.regenerate import read_regenerated

from tests.integration.exposition import sample_value, scrape

GREEDY = {"temperature": 0, "max_new_tokens": 12}
WAIT_S = 60.0


def flag(server, name: str) -> str:
    return server.command[server.command.index(name) + 1]


def post(server, path: str, payload: dict, headers: dict | None = None) -> bytes:
    request = urllib.request.Request(server.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


def captured(folder: Path, marks: list[str]) -> dict[str, dict]:
    """{mark: its record} for each mark found in a record's first message, waiting for the async writer."""
    deadline, found = time.monotonic() + WAIT_S, {}
    while time.monotonic() < deadline:
        found = {}
        for path in sorted(folder.glob("capture-*.jsonl")):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                found.update({mark: record for mark in marks if mark in record["messages"][0]["content"]})
        if len(found) == len(marks):
            break
        time.sleep(0.5)
    return found


def test_served_replies_are_captured_with_acceptance_redacted_and_opted_out(dspark_server):
    folder, pattern = Path(flag(dspark_server, "--capture")), flag(dspark_server, "--capture-redact")
    run = uuid.uuid4().hex[:8]
    # no mark may hold "secret-" and four digits: the run id may start with them, and the pattern would redact it
    marks = {name: f"capture-{name}-{run}" for name in ("generate", "chat", "stream", "redaction", "opted-out")}
    before = sample_value(scrape(dspark_server.url), "dspark_capture_records_total") or 0.0

    generated = json.loads(post(dspark_server, "/generate", {"text": f"# {marks['generate']}\ndef f(",
                                                             "sampling_params": GREEDY}))
    chat = json.loads(post(dspark_server, "/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": marks["chat"]}], "max_tokens": 12,
        "temperature": 0}))
    events = post(dspark_server, "/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": marks["stream"]}], "max_tokens": 12,
        "temperature": 0, "stream": True}).decode().split("\n\n")
    streamed = "".join(json.loads(e[len("data: "):])["choices"][0]["delta"].get("content") or ""
                       for e in events if e.startswith("data: {") and json.loads(e[len("data: "):])["choices"])
    secret = "secret-4711"
    assert re.fullmatch(pattern, secret), "conftest's redaction pattern no longer matches the test's"
    post(dspark_server, "/generate", {"text": f"# {marks['redaction']} {secret}\n", "sampling_params": GREEDY})
    post(dspark_server, "/generate", {"text": f"# {marks['opted-out']}\n", "sampling_params": GREEDY},
         headers={"X-Dspark-Capture": "off"})

    records = captured(folder, list(marks.values()))
    assert marks["opted-out"] not in records
    assert set(records) == {marks[name] for name in ("generate", "chat", "stream", "redaction")}, sorted(records)

    record = records[marks["generate"]]
    assert record["route"] == "/generate" and record["stream"] is False
    assert record["messages"][-1] == {"role": "assistant", "content": generated["text"]}
    assert record["prompt"] == f"# {marks['generate']}\ndef f("
    assert record["sampling"] == GREEDY
    acceptance = record["acceptance"]
    assert acceptance["completion_tokens"] == generated["meta_info"]["completion_tokens"] == record["reply_tokens"]
    assert acceptance["spec_verify_ct"] == generated["meta_info"]["spec_verify_ct"] > 0
    assert acceptance["accepted_per_verify"] == acceptance["completion_tokens"] / acceptance["spec_verify_ct"]
    assert record["target"]["sha256"] and record["drafter"]["sha256"]
    assert record["target"]["sha256"] != record["drafter"]["sha256"]

    chat_record = records[marks["chat"]]
    assert chat_record["messages"] == [{"role": "user", "content": marks["chat"]},
                                       {"role": "assistant", "content": chat["choices"][0]["message"]["content"]}]
    assert chat_record["sampling"] == {"temperature": 0, "max_new_tokens": 12}
    assert chat_record["acceptance"]["completion_tokens"] == chat["usage"]["completion_tokens"]
    assert chat_record["acceptance"]["spec_verify_ct"] > 0
    stream_record = records[marks["stream"]]
    assert stream_record["stream"] is True and stream_record["messages"][-1]["content"] == streamed
    assert stream_record["acceptance"]["spec_verify_ct"] > 0

    secret_record = records[marks["redaction"]]
    assert secret not in json.dumps(secret_record) and "[redacted]" in secret_record["prompt"]
    assert secret_record["messages"][0]["content"] == f"# {marks['redaction']} [redacted]\n"

    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(folder.glob("capture-*.jsonl"))
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
    for path in files:  # every record the server wrote (other tests' too) reads as `dspark train --data` reads
        assert read_regenerated(path)

    exposition = scrape(dspark_server.url)
    assert (sample_value(exposition, "dspark_capture_records_total") or 0.0) >= before + 4
    assert sample_value(exposition, 'dspark_capture_dropped_records_total{reason="queue_full"}') == 0.0
