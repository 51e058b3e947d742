"""`dspark serve`: serve a target with its DSpark drafter through SGLang, dspark's plugin loaded.

    dspark serve --target embedded/target --drafter embedded/dspark          # CPU: the CPU recipe
    dspark serve --target DIR --drafter DIR --policy lagged --port 30000 -- --tp-size 2
    dspark serve ... --admin-port 50051 --admin-token-file tokens/ops --reader-token-file tokens/grafana

Starts `python -m sglang.launch_server` with SGLang's own `--speculative-algorithm DSPARK`, the ragged
verify layout and dspark's allocator as the verify planner (the plugin loads itself through SGLang's
`sglang.srt.plugins` entry point). The drafter is checked against the target before SGLang starts (one in another
trainer's layout that SGLang would serve wrong, such as a speculators export whose slots it would read shifted, is
refused naming `dspark convert`: models/checkpoint_conventions.py); without
--sps-table the plugin profiles one at engine start and reuses it from the cache on later starts. The
runtime-state flags set the initial state; change it live through the gRPC admin API (`--admin-port`: the
admin server runs beside SGLang as a sidecar process, ops/admin/) or SGLang's `/set_internal_state`.
SGLang's admin endpoints always need SGLang's admin key (the first --admin-token-file, --http-admin-key-file,
or a key generated per start), handed over in a private config file, never on the command line; so do the
API keys of --api-key-file, which the OpenAI-compatible API then requires (integration/api_keys.py). Arguments
after `--` go to SGLang unchanged. --dry-run prints the commands and environment instead of starting them.

Graceful drain (Kubernetes sends SIGTERM on every rollout): on SIGTERM or SIGINT both processes get the
signal. SGLang then drains: its health checks answer 503, new generation requests get 503 with Retry-After
(the plugin, integration/drain.py), the requests in flight finish, and it exits 0, which is this command's
status. Should it still run --drain-timeout seconds later, its process tree is killed and the status is 1.
The pod's terminationGracePeriodSeconds must exceed --drain-timeout (docs/deploy.md).

Restart in place (the admin API's Restart, ops/admin/restart.py): on SIGHUP, SGLang drains the same way and is
started again, with the live settings the sidecar handed over as its initial state; the sidecar keeps running.

SGLang is not left dead or stuck: when it exits by itself (a scheduler crashed, say), or fails this command's own
liveness check and is killed (a scheduler stuck in one step for --liveness-step-bound seconds:
ops/commands/serve_watch.py), it is started again after a back-off (1 s, doubling up to 30 s) with the live
settings its schedulers last wrote, and the count of these restarts is `dspark_sglang_restarts` on /metrics. More than --max-restarts of them within RESTART_WINDOW_S and this command
exits non-zero instead, so that Kubernetes sees a crash loop. An SGLang that exits before it ever finished starting
(GET /ready never answered 200: a flag it refuses, a model that does not load) is not started again: the same
arguments would fail the same way, so this command exits non-zero at once.

Request limits (`--max-body-bytes`, `--max-logprobs`, `--max-n`, `--max-queued-requests`, `--max-new-tokens`;
integration/request_limits.py) bound every request to a route that starts model work (integration/request_gate.py).

Capture (`--capture DIR`, off by default; integration/capture.py): each sampled served reply written to DIR as a
`dspark regenerate` record, with its sampling settings, the models' fingerprints and its live acceptance.

Metrics are on (SGLang's `--enable-metrics`: SGLang's and dspark's families on /metrics) unless --no-metrics.

Liveness: `GET /liveness` answers 503 once a scheduler has not run its loop for --liveness-step-bound seconds
(--liveness-window inside an admin request), or has had work and run no forward for --liveness-window seconds
(integration/liveness.py); `/health_generate` stays the readiness check.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from functools import partial
from pathlib import Path

import psutil
import torch

from dspark.integration.addresses import http_url
from dspark.integration.api_keys import API_KEYS_ENV, check_keys, write_keys
from dspark.integration.capture_settings import CaptureSettings, checked_folder
from dspark.integration.liveness import Liveness
from dspark.integration.metrics import RESTARTS_ENV
from dspark.integration.request_limits import RequestLimits
from dspark.integration.runtime_state import compile_state
from dspark.integration.server import (CPU_ENV, CPU_MAX_TOTAL_TOKENS, READY_TIMEOUT_S, TRACE_LEVEL, cpu_server_args,
                                       dspark_args, dspark_env, launch_command, server_environment)
from dspark.models.cache import cache_root
from dspark.models.checkpoint import read_drafter_config
from dspark.models.decoding.settings import VerifySettings
from dspark.models.decoding.sps_paths import sps_write_dir
from dspark.models.decoding.sts import load_sts
from dspark.models.errors import ConfigError
from dspark.models.target_io import load_target_config
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.restart import RESTART_SIGNAL, CrashBudget, RestartChannel
from dspark.ops.admin.security import MIN_TOKEN_CHARS, read_secret
from dspark.ops.admin.sidecar import add_admin_args, add_otlp_args, admin_arg_list, check_admin_args, stop_sidecar
from dspark.ops.arg_types import PORT, finite_float, int_in
from dspark.ops.commands.serve_watch import watch_liveness
from dspark.ops.commands.settings_args import add_settings_args, settings_from_args, values_from_args

DRAIN_TIMEOUT_S = 90.0
MAX_DRAIN_TIMEOUT_S = 86400.0  # a day; a negative one used to kill SGLang at once, with no drain
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0  # restarts counted towards --max-restarts: those of the last ten minutes
BACKOFF_S = (1.0, 30.0)  # the first restart's delay, doubling with each restart in the window, up to the second
API_KEYS_FILE = "api-keys"  # in secrets_dir: the --api-key-file keys handed to the plugin


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve the target with DSpark through SGLang (+ dspark's plugin)",
                                   description=__doc__.splitlines()[0])
    models = parser.add_argument_group("models")
    models.add_argument("--target", type=Path, required=True, help="transformers model directory of the target")
    drafter = models.add_mutually_exclusive_group(required=True)
    drafter.add_argument("--drafter", type=Path, help="DSpark drafter checkpoint directory")
    drafter.add_argument("--no-spec", action="store_true", help="serve the target alone (baseline)")
    models.add_argument("--sts", type=Path, default=None,
                        help="STS calibration JSON from `dspark calibrate` (SGLang applies it at load)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=PORT, default=30000)
    server.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when a GPU is visible, else cpu with the CPU recipe (float32, no CUDA "
                             "graphs, no overlap scheduling, small KV pool)")
    server.add_argument("--max-total-tokens", type=int_in(1, 2**31 - 1), default=None,
                        help=f"KV pool size in tokens (CPU default {CPU_MAX_TOTAL_TOKENS}; GPU: SGLang's choice)")
    server.add_argument("--max-running-requests", type=int_in(1, 65536), default=None,
                        help="concurrent requests in a batch")
    server.add_argument("--no-metrics", action="store_true",
                        help="do not pass SGLang --enable-metrics (on by default: /metrics with SGLang's and dspark's "
                             "families)")
    server.add_argument("--dry-run", action="store_true", help="print the SGLang command and environment; start nothing")
    server.add_argument("--profile-sps-only", action="store_true",
                        help="start SGLang, wait until it serves (with no --sps-table its schedulers measure the SPS "
                             "table by SGLang's forward and cache it under $DSPARK_SPS_DIR first), stop it and exit: "
                             "the chart's SPS Job")
    server.add_argument("--drain-timeout", type=finite_float, default=DRAIN_TIMEOUT_S,
                        help="seconds the requests in flight get to finish after SIGTERM before SGLang is killed "
                             f"(default {DRAIN_TIMEOUT_S:g}; keep it below the pod's terminationGracePeriodSeconds)")
    server.add_argument("--max-restarts", type=int_in(0, 1000), default=MAX_RESTARTS,
                        help=f"times SGLang is started again after exiting by itself within {RESTART_WINDOW_S:g} s "
                             f"before this command gives up and exits non-zero (default {MAX_RESTARTS}; 0: never)")
    add_settings_args(parser, "request limits (integration/request_limits.py)", schema=RequestLimits)
    add_settings_args(parser, "liveness: GET /liveness (integration/liveness.py)", schema=Liveness)
    add_settings_args(parser, "capture of served traffic, off without --capture (integration/capture_settings.py; "
                      "docs/traffic-loop.md)", schema=CaptureSettings)
    add_settings_args(parser, "runtime state (initial values; live-tunable through /set_internal_state)")
    server.add_argument("--http-admin-key-file", type=Path, default=None,
                        help="SGLang's --admin-api-key, which /set_internal_state and SGLang's other admin endpoints "
                             "then require (default: the first --admin-token-file, else a key generated per start)")
    server.add_argument("--api-key-file", type=Path, action="append", default=[],
                        help="a file holding an API key the OpenAI-compatible API then requires (Authorization: Bearer "
                             "KEY; repeat it for several keys, e.g. the current and the next one while rotating): "
                             "integration/api_keys.py. Health, liveness and metrics routes stay open")
    add_admin_args(parser)
    add_otlp_args(parser)
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER, help="-- then arguments passed to SGLang as they are")
    parser.set_defaults(func=run)


def secrets_dir(args: argparse.Namespace) -> Path:
    """Private per-port folder of this start's secrets: SGLang's config with the admin key, and the key."""
    return cache_root() / "serve" / f"port-{args.port}"


def admin_key(args: argparse.Namespace) -> str:
    """SGLang's admin key: --http-admin-key-file, else the first admin token, else a fresh random key.

    SGLang turns its config file into command-line words (`--admin-api-key KEY`), so a key that starts with "-"
    reads as a flag and SGLang exits at start: generated keys are hex, and a given one is refused."""
    source = args.http_admin_key_file or (args.admin_token_file[0] if args.admin_token_file else None)
    if source is None:
        return secrets.token_hex(32)
    key = read_secret(source, "admin key file")
    if len(key) < MIN_TOKEN_CHARS:
        raise ConfigError(f"admin key file {source} holds a key of {len(key)} characters; use at least "
                          f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)")
    if key.startswith("-"):
        raise ConfigError(f"admin key file {source} holds a key that starts with '-', which SGLang reads as a "
                          f"flag; use a key that starts with a letter or digit (e.g. `openssl rand -hex 32`)")
    return key


def api_keys(args: argparse.Namespace) -> list[str]:
    """The keys of --api-key-file, each checked (integration/api_keys.py); none: the API is open."""
    if not args.api_key_file:
        return []
    return check_keys([read_secret(path, "--api-key-file") for path in args.api_key_file], "--api-key-file")


def write_secrets(folder: Path, key: str, keys: list[str]) -> None:
    """SGLang reads its admin key from a YAML config, the plugin the API keys from a file (never the command line,
    which `ps` shows). With API keys, SGLang also gets an api key of its own, random per start, which its warmup
    sends and the plugin hands on with every request it admits (integration/api_keys.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    config = f"admin-api-key: {json.dumps(key)}\n" + (f"api-key: {secrets.token_hex(32)}\n" if keys else "")
    for name, text in (("admin-key", key + "\n"), ("sglang-secrets.yaml", config)):
        path = folder / name
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(text)
    (folder / API_KEYS_FILE).unlink(missing_ok=True)  # a start without keys serves no key of an earlier start
    if keys:
        write_keys(folder / API_KEYS_FILE, keys)


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], bool]:
    """(the SGLang command, the environment it adds, whether it runs the CPU recipe); checks every input first."""
    target_config, _ = load_target_config(args.target)
    cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    extra = cpu_server_args(args.max_total_tokens or CPU_MAX_TOTAL_TOKENS) if cpu else (
        ["--max-total-tokens", str(args.max_total_tokens)] if args.max_total_tokens else [])
    if args.max_running_requests is not None:
        extra += ["--max-running-requests", str(args.max_running_requests)]
    if not args.no_metrics:
        extra += ["--enable-metrics"]
    if not 0 <= args.drain_timeout <= MAX_DRAIN_TIMEOUT_S:
        raise ConfigError(f"--drain-timeout must be in [0, {MAX_DRAIN_TIMEOUT_S:g}] seconds, got "
                          f"{args.drain_timeout:g}")
    env = {**values_from_args(args, RequestLimits).to_env(), **values_from_args(args, Liveness).to_env(),
           **capture_settings(args).to_env()}
    if args.drafter is not None:
        drafter = read_drafter_config(args.drafter, target_config)
        # Checked whole now; without a table, causal/lagged get the one the plugin profiles at engine start.
        state = settings_from_args(args).check_gamma(drafter.gamma)
        if state.sps_table:
            compile_state(state, drafter.gamma)  # loads and checks the table
        if args.sts is not None:
            load_sts(args.sts, drafter.gamma)  # SGLang would read it only at start-up, and take inf temperatures
        extra += dspark_args(args.drafter, cpu=cpu, sps_table=state.sps_table, sts=args.sts)
        env.update(dspark_env(state.to_dict()))
    if args.admin_port is not None:
        check_admin_args(args)
    if args.otlp_endpoint:  # SGLang's own tracing; the plugin adds its round spans to it
        extra += ["--enable-trace", "--otlp-traces-endpoint", args.otlp_endpoint,
                  "--otlp-service-name", args.otlp_service_name]
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = args.otlp_protocol
        # SGLang's own default (3) adds spans for every scheduling slice; 1 keeps a span per request
        env["SGLANG_TRACE_LEVEL"] = os.environ.get("SGLANG_TRACE_LEVEL", TRACE_LEVEL)
    if api_keys(args):
        env[API_KEYS_ENV] = str(secrets_dir(args) / API_KEYS_FILE)
    extra += ["--config", str(secrets_dir(args) / "sglang-secrets.yaml")]
    passthrough = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
    return launch_command(args.target, args.host, args.port, extra + passthrough), env, cpu


def capture_settings(args: argparse.Namespace) -> CaptureSettings:
    """The capture's settings, its folder checked (made when missing) and absolute: SGLang runs elsewhere."""
    settings = values_from_args(args, CaptureSettings)
    if settings.capture is None:
        return settings
    return replace(settings, capture=str(checked_folder(settings.capture)))


def local_url(args: argparse.Namespace) -> str:
    """SGLang's URL from this machine (a wildcard --host: reached on loopback)."""
    return http_url({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host), args.port)


def sidecar_command(args: argparse.Namespace) -> list[str]:
    """The admin server beside SGLang (docs/admin.md: why a sidecar process)."""
    return [sys.executable, "-m", "dspark.ops.cli", "admin-server", "--sglang-url", local_url(args),
            "--sglang-admin-key-file", str(secrets_dir(args) / "admin-key"), "--supervisor-pid", str(os.getpid()),
            "--supervisor-folder", str(secrets_dir(args)), *admin_arg_list(args)]


def watch_start(server: subprocess.Popen, backend: SGLangBackend) -> threading.Event:
    """An event set once `server` has finished its start-up (GET /ready answered 200); never set when it exits
    first."""
    started = threading.Event()

    def watch() -> None:
        while server.poll() is None:
            if backend.started():
                started.set()
                return
            time.sleep(1.0)

    threading.Thread(target=watch, name="sglang-start-watch", daemon=True).start()
    return started


def wait_draining(server: subprocess.Popen, draining: threading.Event, drain_timeout: float) -> int:
    """SGLang's exit status; once `draining` is set it gets drain_timeout seconds, then its tree is killed (1)."""
    while server.poll() is None:
        if draining.wait(timeout=1.0):
            try:
                return server.wait(timeout=drain_timeout)
            except subprocess.TimeoutExpired:
                print(f"dspark serve: SGLang still running {drain_timeout:g} s after SIGTERM; killing it",
                      file=sys.stderr)
                kill_tree(server.pid)
                server.wait()
                return 1
    return server.returncode


def restart_environment(env: dict[str, str], settings: dict | None, gamma: int) -> dict[str, str]:
    """`env` with `settings` (a restart's hand-over) as the initial state; unchanged when they do not check out."""
    if settings is None:
        return env
    try:
        state = VerifySettings.from_dict(settings).check_gamma(gamma)
    except ConfigError as err:
        print(f"dspark serve: restarting with the initial settings: the handed-over ones are invalid: {err}",
              file=sys.stderr)
        return env
    return {**env, **dspark_env(state.to_dict())}


def profile_sps_only(server: subprocess.Popen, args: argparse.Namespace) -> int:
    """Wait until SGLang serves, which it does once its schedulers hold their SPS table, then stop it: 0 when it
    served, else SGLang's exit status (1 when it never served within READY_TIMEOUT_S)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while server.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(local_url(args) + "/health", timeout=5) as answer:
                served = answer.status == 200
        except (OSError, ValueError):
            served = False
        if served:
            print(f"dspark serve: SGLang served; its SPS table is cached under {sps_write_dir() / 'sglang'}",
                  file=sys.stderr, flush=True)
            server.send_signal(signal.SIGTERM)
            stopping = threading.Event()
            stopping.set()  # wait_draining's bound applies from now: drain_timeout, then the tree is killed
            wait_draining(server, stopping, args.drain_timeout)
            return 0
        time.sleep(1.0)
    if server.poll() is None:
        kill_tree(server.pid)
        server.wait()
        print(f"dspark serve: SGLang did not serve within {READY_TIMEOUT_S:g} s", file=sys.stderr)
        return 1
    return server.returncode or 1


def kill_tree(pid: int) -> None:
    root = psutil.Process(pid)
    for process in [*root.children(recursive=True), root]:
        try:
            process.kill()
        except psutil.NoSuchProcess:  # exited meanwhile
            pass


def run(args: argparse.Namespace) -> int:
    command, env, cpu = server_command(args)
    key = admin_key(args)
    added = {**env, **(CPU_ENV if cpu else {})}
    print(" ".join(f"{k}={shlex.quote(v)}" for k, v in added.items()), shlex.join(command))
    sidecar = sidecar_command(args) if args.admin_port is not None else None
    if sidecar:
        print(shlex.join(sidecar))
    if args.dry_run:
        return 0
    if args.profile_sps_only and (args.drafter is None or args.sps_table):
        raise ConfigError("--profile-sps-only measures the SPS table of a DSpark server: it needs --drafter and "
                          "no --sps-table")
    write_secrets(secrets_dir(args), key, api_keys(args))
    restarts = RestartChannel(secrets_dir(args))
    restarts.reset()
    # A neutral working directory: `python -m` puts it on sys.path, and a checkout's bare kernels/ would shadow
    # the `kernels` package SGLang depends on (all paths are absolute by now).
    neutral = cache_root() / "serve"
    crashes = CrashBudget(args.max_restarts, RESTART_WINDOW_S, *BACKOFF_S)
    base_env = {**env, **restarts.live_settings_env()}
    start = lambda environment: subprocess.Popen(
        command, env=server_environment(cpu, {**environment, RESTARTS_ENV: str(crashes.total)}), cwd=neutral)
    server = start(base_env)
    if args.profile_sps_only:
        return profile_sps_only(server, args)
    restarts.record_start()
    backend = SGLangBackend(local_url(args), key, timeout_s=5.0)
    served = watch_start(server, backend)  # set once an SGLang of this command has finished starting
    sidecar_process = subprocess.Popen(sidecar, cwd=neutral) if sidecar else None
    stopping, draining = threading.Event(), threading.Event()
    liveness = values_from_args(args, Liveness)

    def kill_hung(process: subprocess.Popen, found: list[str]) -> None:
        if process.poll() is None:
            print(f"dspark serve: SGLang failed its liveness check ({'; '.join(found)}); killing it", file=sys.stderr,
                  flush=True)
            kill_tree(process.pid)

    def watch(process: subprocess.Popen) -> None:
        watch_liveness(process, liveness, backend.started, lambda: stopping.is_set() or draining.is_set(),
                       partial(kill_hung, process))

    watch(server)

    def forward(sig, _frame) -> None:
        for process in (server, sidecar_process):
            if process is not None and process.poll() is None:
                process.send_signal(sig)
        stopping.set()
        draining.set()

    def drain_for_restart(_sig, _frame) -> None:
        if not stopping.is_set() and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            draining.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    signal.signal(RESTART_SIGNAL, drain_for_restart)
    gamma = read_drafter_config(args.drafter).gamma if args.drafter is not None else 0
    while True:
        code = wait_draining(server, draining, args.drain_timeout)
        if stopping.is_set():
            break
        if draining.is_set():  # a restart in place (the admin API's Restart): drained
            print(f"dspark serve: SGLang drained (status {code}); starting it again", file=sys.stderr, flush=True)
        elif not served.is_set():  # the same arguments would fail the same way: not a crash to retry
            print(f"dspark serve: SGLang exited (status {code}) before its first start-up finished (GET /ready never "
                  "answered 200); not starting it again: see its error above", file=sys.stderr, flush=True)
            code = code or 1
            break
        else:  # SGLang exited by itself
            delay = crashes.next_delay()
            if delay is None:
                print(f"dspark serve: SGLang exited unexpectedly (status {code}) after {args.max_restarts} restarts "
                      f"within {RESTART_WINDOW_S:g} s (--max-restarts); giving up", file=sys.stderr, flush=True)
                code = code or 1
                break
            print(f"dspark serve: SGLang exited unexpectedly (status {code}); starting it again in {delay:g} s "
                  f"(restart {crashes.total})", file=sys.stderr, flush=True)
            if stopping.wait(delay):
                break
        draining.clear()
        server = start(restart_environment(base_env, restarts.live_settings(), gamma))
        restarts.record_start()
        watch(server)
        if not served.is_set():
            served = watch_start(server, backend)
    if sidecar_process is not None:
        stop_sidecar(sidecar_process)
    return code
