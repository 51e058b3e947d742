"""`dspark serve --api-key-file` (twice: two keys, as while rotating) on a real SGLang server with dspark's plugin:
the OpenAI-compatible API answers either key and refuses a missing or wrong one with 401, counted on /metrics;
probes, metrics and the admin API (SGLang's admin key) stay as they were; no key is on a command line."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import psutil
import pytest

from tests.integration.dspark_serve import DsparkServe

KEYS = ("current-key-0123456789abcdef", "next-key-fedcba9876543210")
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api-keys")
    files = []
    for name, key in zip(("current", "next"), KEYS):
        (folder / name).write_text(key + "\n")
        files += ["--api-key-file", str(folder / name)]
    yield from DsparkServe.alone(folder, dspark_args=tuple(files)).serving()


def status(url: str, path: str, key: str | None = None, body: dict | None = None,
           authorization: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None or authorization is not None:
        headers["Authorization"] = authorization or f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data, headers=headers), timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def refused(server: DsparkServe, reason: str) -> float:
    return server.metric(f'dspark_api_key_refused_requests_total{{reason="{reason}"}}')


def test_either_key_is_accepted_and_a_missing_or_wrong_one_gets_401_counted(server):
    assert [status(server.url, "/v1/chat/completions", key, CHAT) for key in KEYS] == [200, 200]
    assert status(server.url, "/v1/models", KEYS[1]) == 200
    before = {reason: refused(server, reason) for reason in ("missing", "wrong")}
    assert status(server.url, "/v1/chat/completions", None, CHAT) == 401
    assert status(server.url, "/v1/models") == 401
    assert status(server.url, "/v1/chat/completions", KEYS[0][:-1], CHAT) == 401  # a prefix of a key
    assert status(server.url, "/v1/chat/completions", KEYS[0] + "x", CHAT) == 401  # a key and more
    assert status(server.url, "/generate", None, {"text": "a"}, authorization=f"Basic {KEYS[0]}") == 401
    assert refused(server, "missing") - before["missing"] == 3  # no header, and a scheme other than Bearer
    assert refused(server, "wrong") - before["wrong"] == 2


def test_probes_metrics_and_the_admin_api_need_no_api_key(server):
    for path in ("/health", "/health_generate", "/liveness", "/metrics"):
        assert status(server.url, path) == 200, path
    client = server.client(server.reader_token)  # the sidecar reaches SGLang with SGLang's admin key
    try:
        assert client.serving()
    finally:
        client.close()


def test_no_process_has_a_key_on_its_command_line(server):
    processes = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
    command_lines = " ".join(" ".join(p.cmdline()) for p in processes)
    assert "sglang.launch_server" in command_lines
    assert not any(key in command_lines for key in KEYS)
