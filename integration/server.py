"""Start and stop a real SGLang 0.5.23 server process, and the flags that serve DSpark with dspark's plugin.

`SGLangServer` runs `python -m sglang.launch_server` in its own process group, from a neutral working
directory (the repo root would put its bare `kernels/`, `models/` folders on sys.path, shadowing the
`kernels` package SGLang depends on), waits until the model answers, and on exit terminates the whole
group (SGLang forks a scheduler and a detokenizer). If the server dies or never becomes ready, the error
carries the tail of its log.

The CPU recipe (docs/serving.md, "The CPU recipe"): `SGLANG_USE_CPU_ENGINE=1` routes RoPE and friends
to their native paths, `--device cpu` picks the torch-native attention backend, float32 (CPU matmuls in
bf16 are slow without AMX), no CUDA graphs or overlap scheduling, and `--max-total-tokens` keeps the KV
pool small (without it SGLang reserves ~70% of RAM). The CPU stand-in for `sgl_kernel` is on sys.path
through the venv (scripts/setup_env.sh).

DSpark (`dspark_args`, `dspark_env`): SGLang's own `--speculative-algorithm DSPARK` worker with the ragged
verify layout (`SGLANG_RAGGED_VERIFY_MODE=compact`, where verify lengths are planned per request at all)
and dspark's runtime state (integration/runtime_state.py) in `DSPARK_RUNTIME_STATE`.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dspark.integration.addresses import http_url
from dspark.integration.runtime_state import ENV_VAR
from dspark.models.cache import cache_root
from dspark.models.checkpoint import sglang_checkpoint

CPU_MAX_TOTAL_TOKENS = 8192
RAGGED_VERIFY_MODE = "compact"
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # SGLang's native (non-CUDA) RoPE, norms and friends
    # SGLang torch.compiles a few sampling helpers (the repetition penalty's scaling among them): on a CPU the first
    # request that reaches one compiles C++ with inductor, a scheduler step of a minute or more on two busy cores,
    # which the liveness step bound takes for a hung scheduler. Eager runs the same math.
    "TORCH_COMPILE_DISABLE": "1",
}
SERVER_PORTS = (20000, 32000)  # [start, stop): below Linux's default ephemeral range 32768-60999
READY_TIMEOUT_S = 300.0
LOG_TAIL_CHARS = 4000
TRACE_LEVEL = "1"  # SGLANG_TRACE_LEVEL unless set: request spans, not per-slice ones (bench/results/trace-overhead)


def free_port() -> int:
    """A free port below the kernel's ephemeral range: SGLang binds its own internal sockets to ephemeral
    ports while it starts, and one of those must not take the HTTP port before uvicorn binds it."""
    for port in random.Random().sample(range(*SERVER_PORTS), 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {SERVER_PORTS}")


def cpu_server_args(max_total_tokens: int = CPU_MAX_TOTAL_TOKENS) -> list[str]:
    """SGLang's flags for serving on the CPU. --sleep-on-idle: an idle scheduler otherwise polls its sockets in a
    busy loop, taking a core from everything else on the machine (a second replica beside it answered 4 prompts
    in 7-15 s instead of 0.65 s); sleeping, it still wakes the moment a request or an admin call arrives."""
    return ["--device", "cpu", "--dtype", "float32", "--max-total-tokens", str(max_total_tokens),
            "--disable-cuda-graph", "--disable-overlap-schedule", "--sleep-on-idle"]


def dspark_args(drafter: str | Path, *, cpu: bool, sps_table: str | Path | None = None,
                sts: str | Path | None = None) -> list[str]:
    """SGLang flags for DSpark with `drafter` (paths made absolute: the server runs elsewhere; a compact drafter's
    full-row copy, which SGLang's loader needs: models/checkpoint.py)."""
    loadable = sglang_checkpoint(drafter, cache_root())
    args = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(Path(loadable).resolve())]
    if cpu:  # the plugin makes torch_native a draft attention backend; SGLang would pick a CUDA one
        args += ["--speculative-draft-attention-backend", "torch_native"]
    if sps_table is not None:
        args += ["--speculative-dspark-sps-table-path", str(Path(sps_table).resolve())]
    if sts is not None:
        args += ["--speculative-dspark-confidence-sts-path", str(Path(sts).resolve())]
    return args


def dspark_env(runtime_state: dict | None = None) -> dict[str, str]:
    """Environment for a DSpark server: ragged verify, and dspark's initial runtime state."""
    return {"SGLANG_RAGGED_VERIFY_MODE": RAGGED_VERIFY_MODE, ENV_VAR: json.dumps(runtime_state or {})}


def launch_command(model_path: str | Path, host: str, port: int, extra_args: list[str] = ()) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(Path(model_path).resolve()),
            "--host", host, "--port", str(port), *extra_args]


def server_environment(cpu: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    return dict(os.environ, **(extra or {}), **(CPU_ENV if cpu else {}))


def stop_process_group(process: subprocess.Popen | None, timeout_s: float = 30.0) -> None:
    """SIGTERM the process group a `start_new_session` process leads (SGLang forks its scheduler and
    detokenizer into it), then SIGKILL whatever is still there after `timeout_s`."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class SGLangServer:
    """A running `sglang.launch_server`; use as a context manager.

    >>> with SGLangServer("embedded/target", extra_args=cpu_server_args(), cpu=True) as server:
    ...     server.post("/generate", {"text": "def ", "sampling_params": {"max_new_tokens": 8}})
    """

    def __init__(self, model_path: str | Path, *, extra_args: list[str] = (), cpu: bool = True,
                 env: dict[str, str] | None = None, log_path: str | Path | None = None, host: str = "127.0.0.1",
                 port: int | None = None):
        self.host, self.port = host, port or free_port()
        self.url = http_url(host, self.port)
        self.command = launch_command(model_path, host, self.port, extra_args)
        self.env = server_environment(cpu, env)
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/dspark-sglang-{self.port}.log")
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "SGLangServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        log = self.log_path.open("w")
        self._process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.log_path.parent, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"SGLang server exited with code {self._process.returncode} before it was "
                                   f"ready.\n--- {self.log_path} ---\n{self.log_tail()}")
            try:
                self.get("/get_model_info", timeout_s=5)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"SGLang server not ready after {timeout_s:.0f}s.\n--- {self.log_path} ---\n"
                           f"{self.log_tail()}")

    def stop(self) -> None:
        stop_process_group(self._process)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log_path.exists() else ""

    def get(self, path: str, timeout_s: float = 60) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as response:
            return json.loads(response.read())

    def post(self, path: str, payload: dict, timeout_s: float = 120) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
