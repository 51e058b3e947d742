"""A real `dspark serve --admin-port` (SGLang + dspark's plugin + the admin sidecar, tracing to an OTLP endpoint)
started for a test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dspark.integration.server import SGLangServer, free_port, stop_process_group
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.convert import message_to_settings

from tests.integration.exposition import sample_value, scrape
from tests.paths import EMBEDDED, EMBEDDED_TARGET
from tests.server_starts import record_server_start

READY_TIMEOUT_S = 400.0
GAMMA = 5  # embedded/dspark's block size
CHUNKED_PREFILL_TOKENS = 256  # below the embedded target's 2048-token context (SGLang's CPU default is 4096), so a
                              # long prompt prefills in chunks as it would on a GPU replica
IN_FLIGHT = "dspark_gate_sub_requests_in_flight"
# The request limits of the shared gate_limits_server (tests/integration/conftest.py): small enough for a test to reach
MAX_QUEUED_REQUESTS, MAX_SESSIONS, MAX_SESSION_ID_CHARS, SESSION_LIFETIME_S = 16, 4, 40, 20.0
RESTARTED = "); starting it again"  # what `dspark serve` logs each time it starts SGLang again (not "not starting")


class DsparkServe:
    """`dspark serve` of the embedded target + DSpark with `drafter` (or, no_spec, the target alone) with the admin API,
    in its own process group."""

    def __init__(self, folder: Path, cache: Path, admin_token: Path, reader_token: Path, otlp_endpoint: str,
                 *sglang_args: str, dspark_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 no_spec: bool = False, drafter: Path = EMBEDDED / "dspark"):
        self.folder, self.cache, self.port, self.admin_port = folder, cache, free_port(), free_port()
        self.url, self.admin_address = f"http://127.0.0.1:{self.port}", f"127.0.0.1:{self.admin_port}"
        self.audit_log, self.log = folder / "audit.jsonl", folder / "serve.log"
        self.admin_token, self.reader_token, self.no_spec = admin_token, reader_token, no_spec
        speculation = ["--no-spec"] if no_spec else ["--drafter", str(drafter), "--policy", "fixed",
                                                     "--drafting", "always"]
        self.service_name = f"dspark-{folder.name}"  # of its spans (its admin sidecar's: with -admin)
        self.command = [sys.executable, "-m", "dspark.ops.cli", "serve", "--target", str(EMBEDDED_TARGET),
                        *speculation, "--device", "cpu", "--port", str(self.port), "--admin-port", str(self.admin_port),
                        "--admin-token-file", str(admin_token), "--reader-token-file", str(reader_token),
                        "--admin-audit-log", str(self.audit_log), "--admin-update-rate", "100000",
                        "--admin-update-burst", "100000", "--otlp-endpoint", otlp_endpoint,
                        "--otlp-service-name", self.service_name, *dspark_args, "--",
                        "--max-running-requests", "8", "--decode-log-interval", "1",
                        "--chunked-prefill-size", str(CHUNKED_PREFILL_TOKENS), *sglang_args]
        self.env = {**os.environ, "DSPARK_CACHE": str(cache), **(env or {})}
        self.env.pop("TRITON_INTERPRET", None)
        self.process: subprocess.Popen | None = None
        self.restarts_recorded = False

    @classmethod
    def alone(cls, folder: Path, dspark_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
              sglang_args: tuple[str, ...] = (), no_spec: bool = False,
              drafter: Path = EMBEDDED / "dspark", otlp_endpoint: str = "") -> "DsparkServe":
        """A replica of its own under `folder`: its cache, an admin and a reader token file (the callers ops-admin and
        dashboard), tracing to `otlp_endpoint` (none by default); metrics on (`dspark serve`'s default)."""
        tokens = folder / "tokens"
        tokens.mkdir(parents=True)
        for name in ("ops-admin", "dashboard"):
            (tokens / name).write_text(f"{name}-token-of-a-test-replica\n")
        (folder / "replica").mkdir()
        return cls(folder / "replica", folder / "cache", tokens / "ops-admin", tokens / "dashboard", otlp_endpoint,
                   *sglang_args, dspark_args=dspark_args, env=env, no_spec=no_spec, drafter=drafter)

    def start(self) -> "DsparkServe":
        record_server_start("dspark serve")
        self.process = subprocess.Popen(self.command, env=self.env, cwd=self.folder, stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self) -> None:
        """Until the admin API's health is SERVING (warmed up, the scheduler answering with its DSpark state) or,
        with --no-spec (no DSpark state to answer with), until SGLang's GET /ready answers 200."""
        client = self.client(self.reader_token)
        ready = self.sglang_ready if self.no_spec else client.serving
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while not ready():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"dspark serve did not become ready:\n{self.log.read_text()[-4000:]}")
                time.sleep(1.0)
        finally:
            client.close()

    def sglang_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/ready", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 while starting
            return False

    def metric(self, sample: str) -> float:
        """One sample's value on the replica's /metrics, as `name{labels}` is written there (0 while absent)."""
        value = sample_value(scrape(self.url), sample)
        return 0.0 if value is None else value

    def wait_for_in_flight(self, count: int, timeout_s: float = 60.0) -> bool:
        """Wait until the request gate holds `count` sub-requests in flight (admitted, not yet answered): on two
        busy cores a request sent a second ago may not have arrived yet. False when it has not by timeout_s."""
        deadline = time.monotonic() + timeout_s
        while self.metric(IN_FLIGHT) != count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def client(self, token_file: Path | None) -> AdminClient:
        token = token_file.read_text().strip() if token_file else None
        return AdminClient(self.admin_address, Credentials(token))

    def stop(self) -> None:
        stop_process_group(self.process)
        if self.process is not None and not self.restarts_recorded:  # the SGLang starts after the first
            self.restarts_recorded = True
            for _ in range(self.log.read_text(errors="replace").count(RESTARTED)):
                record_server_start("dspark serve's restart")

    def get(self, path: str, timeout_s: float = 60) -> dict:
        return SGLangServer.get(self, path, timeout_s)  # the same client calls, on this replica's url

    def post(self, path: str, payload: dict, timeout_s: float = 120) -> dict:
        return SGLangServer.post(self, path, payload, timeout_s)

    def post_as_admin(self, path: str, payload: dict, timeout_s: float = 120):
        """POST to one of SGLang's admin routes with its admin key (`dspark serve` gave SGLang the first admin token
        as that key); an HTTPError for a refusal, as `post`."""
        request = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.admin_token.read_text().strip()}"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def set_state(self, changes: dict) -> list:
        """Change the live runtime state over SGLang's own route: one answer per scheduler, [True] when applied."""
        return self.post_as_admin("/set_internal_state", {"server_args": {"dspark": changes}})

    @contextmanager
    def restoring(self) -> Iterator["DsparkServe"]:
        """The replica, for a test that changes its runtime state: the settings it found are set again afterwards,
        so later tests read its start settings (only the state version and the counters tell it happened)."""
        client = self.client(self.admin_token)
        try:
            found = message_to_settings(client.get().settings)
            yield self
            if message_to_settings(client.get().settings) != found:
                client.update(found)
            assert message_to_settings(client.get().settings) == found, "the replica's settings were not restored"
        finally:
            client.close()

    def serving(self) -> Iterator["DsparkServe"]:
        """Started and ready until the generator is closed, then stopped (a fixture's body: `yield from`)."""
        self.start()
        try:
            self.wait_ready()
            yield self
        finally:
            self.stop()


def target_greedy_answers(prompts: list[str], max_new_tokens: int) -> dict[str, list[int]]:
    """transformers' greedy continuation of each prompt on the embedded target, max_new_tokens long whatever EOS
    (what the server answers with ignore_eos): the reference a served answer must equal."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET, dtype=torch.float32).eval()
    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    answers = {}
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            answers[prompt] = model.generate(ids, generation_config=config)[0, ids.shape[1]:].tolist()
    return answers
