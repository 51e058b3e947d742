"""`GET /liveness`: fails when the schedulers hang, passes while they are idle or busy with healthy work.

SGLang 0.5.23's `/health` (with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, as the chart sets it) answers 200
once startup is over, whatever the schedulers do since; `/health_generate` generates a token, which a hung
scheduler fails, but a busy one may too, so it serves readiness, not liveness. This endpoint reads what each
scheduler process last reported of its own loop:

    scheduler side  every pass of the scheduler's loop (AFTER `Scheduler.ingest_requests`, which every loop calls
                    each iteration; an idle loop still passes at least once a second: SGLang's idle sleeper polls
                    with a 1 s timeout) notes it ran; at most once a second it writes a heartbeat file
                    {beat, progress, queued, control, longest_step}: when it last ran, when it last made progress
                    (ran a forward, had nothing to do, or was paused by /pause_generation), how many requests wait
                    or run, whether it is inside an admin request (BEFORE `process_input_requests` with one that
                    is not model work: loading weights, profiling, ...; written at once) and the longest pass so
                    far
    HTTP side       GET /liveness reads the heartbeats: 503 naming the scheduler when one has not run its loop
                    for `liveness_step_bound` seconds (a step that never ends: SIGSTOP, a hung collective, a
                    forward or a stop check that never returns), for `liveness_window` seconds inside an admin
                    request, or has had work and run no forward for `liveness_window` seconds (it stopped making
                    progress); otherwise 200. Before any scheduler has reported (startup) it answers 200: the
                    startup probe covers that time.

`dspark serve` applies the same check (`problems`) to the same files every second and restarts SGLang itself when
it fails (ops/commands/serve_watch.py), so a stuck replica comes back within about the step bound without the
kubelet.

The step bound must exceed the longest legitimate pass of the loop: one forward of at most --chunked-prefill-size
tokens and its bookkeeping (a long generation is many short passes and never comes near it; `longest_step` in
the answer shows what this replica's passes took). The window must exceed the longest admin request (a weight
reload) and any time requests legitimately wait with no forward. One definition of both (`Liveness`,
env_settings.py): `dspark serve --liveness-window --liveness-step-bound`, handed to SGLang's HTTP process in
DSPARK_LIVENESS. The heartbeat folder is per SGLang start: the launcher names it (under the temporary folder, by
its pid: `heartbeat_folder_of`) in DSPARK_HEARTBEAT_DIR before it starts the schedulers, which inherit it. Under
tensor parallelism the ranks run their loops in lockstep (every iteration starts with rank 0's broadcast of the
new requests), so one hung rank stalls them all; on a multi-node group the HTTP process sees the heartbeats of its
own node's ranks, which is enough for that reason.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dspark.integration.env_settings import EnvSettings
from dspark.models.decoding.settings import setting

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

HEARTBEAT_DIR_ENV = "DSPARK_HEARTBEAT_DIR"
BEAT_EVERY_S = 1.0
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"


@dataclass(frozen=True)
class Liveness(EnvSettings):
    ENV_VAR = "DSPARK_LIVENESS"

    liveness_window: float = setting(300.0, "seconds a scheduler may have work and run no forward, or spend in "
                                     "one admin request (a weight reload), before GET /liveness fails", float,
                                     low=1.0, high=86400.0)
    liveness_step_bound: float = setting(60.0, "seconds one pass of a scheduler's loop (one forward and its "
                                         "bookkeeping) may take before GET /liveness fails and dspark serve "
                                         "restarts SGLang (longer than the longest single forward)", float,
                                         low=1.0, high=86400.0)


class Heartbeat:
    """One scheduler process's heartbeat file (scheduler side; `folder` None: not a process SGLang started)."""

    def __init__(self, folder: Optional[Path]) -> None:
        self.folder = folder
        self.written = -math.inf
        self.forwards: Optional[int] = None  # the scheduler's forward count when last written
        self.progress: Optional[float] = None
        self.queued = 0
        self.control = False  # written while the loop is inside an admin request
        self.passed: Optional[float] = None  # when the loop last passed
        self.longest_step = 0.0

    @classmethod
    def from_environment(cls) -> "Heartbeat":
        folder = os.environ.get(HEARTBEAT_DIR_ENV)
        return cls(Path(folder) if folder else None)

    def due(self, now: float) -> bool:
        return self.folder is not None and (self.control or now - self.written >= BEAT_EVERY_S)

    def passed_at(self, now: float) -> None:
        """The loop passed at `now`: the pass before it took the time since the last one."""
        if self.passed is not None:
            self.longest_step = max(self.longest_step, now - self.passed)
        self.passed = now

    def write(self, forwards: int, queued: int, now: float, control: bool = False) -> None:
        """The loop ran at `now` (time.monotonic(): one clock for every process of the host) having run
        `forwards` forwards in all, with `queued` requests waiting or running; `control`: it is about to run an
        admin request."""
        if forwards != self.forwards or queued == 0:
            self.forwards, self.progress = forwards, now
        self.queued, self.control = queued, control
        path = self.folder / f"scheduler-{os.getpid()}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"pid": os.getpid(), "beat": now, "progress": self.progress,
                                         "queued": queued, "control": control,
                                         "longest_step": round(self.longest_step, 3)}))
        temporary.replace(path)
        self.written = now


def problems(beats: list[dict], liveness: Liveness, now: float) -> list[str]:
    """What is hung, by the heartbeats `beats` (Heartbeat's files) at `now`; empty: alive."""
    found = []
    for beat in beats:
        silent, stalled = now - beat["beat"], now - beat["progress"]
        if beat.get("control") and silent > liveness.liveness_window:
            found.append(f"scheduler {beat['pid']} has been in one admin request for {silent:.0f} s "
                         f"(liveness_window {liveness.liveness_window:g} s)")
        elif not beat.get("control") and silent > liveness.liveness_step_bound:
            found.append(f"scheduler {beat['pid']} has not run its loop for {silent:.0f} s "
                         f"(liveness_step_bound {liveness.liveness_step_bound:g} s)")
        elif beat["queued"] and stalled > liveness.liveness_window:
            found.append(f"scheduler {beat['pid']} has {beat['queued']} requests and has run no forward for "
                         f"{stalled:.0f} s (liveness_window {liveness.liveness_window:g} s)")
    return found


def read_beats(folder: Path) -> list[dict]:
    beats = []
    for path in sorted(folder.glob("scheduler-*.json")):
        try:
            beats.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # replaced or removed while read: the next probe reads it again
            continue
    return beats


MODEL_WORK = ("TokenizedGenerateReqInput", "TokenizedEmbeddingReqInput", "BatchTokenizedGenerateReqInput",
              "BatchTokenizedEmbeddingReqInput", "AbortReq", "OpenSessionReqInput", "CloseSessionReqInput")


def _queued(scheduler) -> int:
    """Requests waiting or running; none while /pause_generation holds the engine (paused is not hung)."""
    if getattr(scheduler, "_engine_paused", False):
        return 0
    return len(scheduler.waiting_queue) + len(scheduler.running_batch.reqs)


def _on_loop(state: SchedulerState, result, scheduler, *args, **kwargs) -> None:
    now = time.monotonic()
    state.heartbeat.passed_at(now)
    if state.heartbeat.due(now):
        state.heartbeat.write(scheduler.forward_ct, _queued(scheduler), now)


def _before_requests(state: SchedulerState, scheduler, recv_reqs, *args, **kwargs) -> None:
    """An admin request (not model work) may hold the loop for long: say so before it runs, so that its time
    is judged against the window, not the step bound."""
    if state.heartbeat.folder is not None and any(type(req).__name__ not in MODEL_WORK for req in recv_reqs):
        state.heartbeat.write(scheduler.forward_ct, _queued(scheduler), time.monotonic(), control=True)


def _add_route(liveness: Liveness, *args, **kwargs) -> None:
    from fastapi.responses import JSONResponse
    from sglang.srt.entrypoints.http_server import app

    folder = Path(os.environ[HEARTBEAT_DIR_ENV])

    async def dspark_liveness():  # no return annotation: under `from __future__ import annotations` FastAPI
        # cannot resolve a locally imported JSONResponse, and /openapi.json answered 500
        beats = read_beats(folder)
        found = problems(beats, liveness, time.monotonic())
        return JSONResponse({"alive": not found, "schedulers": len(beats), "problems": found,
                             "longest_step_s": max((beat.get("longest_step", 0.0) for beat in beats), default=0.0)},
                            status_code=503 if found else 200)

    app.add_api_route("/liveness", dspark_liveness, methods=["GET"])


def heartbeat_folder_of(launcher_pid: int) -> Path:
    """The heartbeat folder of the SGLang launcher `launcher_pid` (where `dspark serve` reads it too)."""
    return Path(tempfile.gettempdir()) / f"dspark-heartbeats-{launcher_pid}"


def heartbeat_folder() -> Path:
    """The launcher's fresh heartbeat folder, named in the environment its schedulers inherit."""
    folder = heartbeat_folder_of(os.getpid())
    folder.mkdir(mode=0o700, exist_ok=True)
    for stale in folder.glob("scheduler-*"):  # a pid reused from an earlier start
        stale.unlink(missing_ok=True)
    os.environ[HEARTBEAT_DIR_ENV] = str(folder)
    return folder


def install(state: SchedulerState) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if multiprocessing.parent_process() is None:  # the launcher: SGLang's HTTP app, before any scheduler starts
        liveness = Liveness.from_env()  # a bad hand-over stops the launch here, naming it
        heartbeat_folder()
        HookRegistry.register("sglang.srt.entrypoints.http_server.launch_server", partial(_add_route, liveness),
                              HookType.BEFORE)
    elif HEARTBEAT_DIR_ENV in os.environ:  # a scheduler (the detokenizer never runs this loop)
        HookRegistry.register(f"{SCHEDULER}.ingest_requests", partial(_on_loop, state), HookType.AFTER)
        HookRegistry.register(f"{SCHEDULER}.process_input_requests", partial(_before_requests, state),
                              HookType.BEFORE)
