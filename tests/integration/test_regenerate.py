"""`dspark regenerate` through an OpenAI-compatible endpoint: the real SGLang server of the embedded target on CPU
(the session's shared `nospec_server`, tests/integration/conftest.py).

Greedy replies equal transformers' greedy continuation of the chat template over the conversation so far, so a
second turn is conditioned on the target's own first reply; a run killed midway and run again ends with every
conversation exactly once, the records written before the kill untouched.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from transformers import AutoTokenizer

from dspark.integration.reply_backends import OpenAIChatEndpoint
from dspark.models.training.regenerate import ReplySampling, regenerate

from tests.integration.hf_reference import hf_greedy
from tests.paths import EMBEDDED_TARGET

pytestmark = pytest.mark.slow
GREEDY = ReplySampling(temperature=0.0, max_new_tokens=12)
KILL_AFTER_RECORDS = 3


@pytest.fixture(scope="module")
def server(nospec_server):
    return nospec_server


def test_greedy_replies_are_the_target_s_over_its_own_earlier_turns(server, tmp_path):
    conversations = [
        [{"role": "user", "content": "def main("}],
        [{"role": "user", "content": "import os"}, {"role": "assistant", "content": "a corpus reply"},
         {"role": "user", "content": "class Queue:"}],
        [{"role": "system", "content": "# helpers"}, {"role": "user", "content": "def f(x):"}],
    ]
    out = tmp_path / "regen.jsonl"
    summary = asyncio.run(regenerate(conversations, lambda: OpenAIChatEndpoint(server.url), out, GREEDY, concurrency=2,
                                     progress=False))
    records = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["index"])
    assert [r["index"] for r in records] == [0, 1, 2] and summary.conversations == 3
    assert all(r["sampling"] == asdict(GREEDY) for r in records)
    assert summary.reply_tokens == sum(r["reply_tokens"] for r in records) > 0
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    replies = {}  # the chat template over the conversation before each reply -> the reply
    for record in records:
        messages = record["messages"]
        assert "a corpus reply" not in [m["content"] for m in messages], "given replies are never kept"
        for k, message in enumerate(messages):
            if message["role"] == "assistant":
                prompt = tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
                replies[prompt] = message["content"]
    assert len(replies) == 4, "one reply per single-turn conversation, two for the two-turn one"
    reference = hf_greedy(EMBEDDED_TARGET, list(replies), GREEDY.max_new_tokens)
    assert replies == {prompt: text for prompt, (_, text) in reference.items()}


def regenerate_command(server, source, out, *extra) -> list[str]:
    return [sys.executable, "-m", "dspark.ops.cli", "regenerate", "--input", str(source), "--out", str(out),
            "--endpoint", server.url, "--max-new-tokens", "16", "--concurrency", "2", "--no-progress", *extra]


def test_a_killed_run_resumes_without_duplicates(server, tmp_path):
    source, out = tmp_path / "prompts.jsonl", tmp_path / "regen.jsonl"
    count = 16
    source.write_text("".join(json.dumps({"prompt": f"def function_{i}("}) + "\n" for i in range(count)))
    first = subprocess.Popen(regenerate_command(server, source, out), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_text().count("\n") >= KILL_AFTER_RECORDS):
        assert first.poll() is None, f"regenerate exited early: {first.stderr.read().decode()[-2000:]}"
        assert time.monotonic() < deadline, "no records written in 300 s"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = out.read_text()
    kept = before[: before.rfind("\n") + 1]
    assert 0 < kept.count("\n") < count, "killed midway"
    second = subprocess.run(regenerate_command(server, source, out), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert out.read_text().startswith(kept), "records written before the kill are untouched"
    indices = [json.loads(line)["index"] for line in out.read_text().splitlines()]
    assert sorted(indices) == list(range(count)), "every conversation exactly once"
    assert f"({kept.count(chr(10))} already there)" in second.stdout
