"""`GET /liveness`: fails when the schedulers hang, passes while they are idle or busy with healthy work.

SGLang 0.5.23's `/health` (with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, as the chart sets it) answers 200
once startup is over, whatever the schedulers do since; `/health_generate` generates a token, which a hung
scheduler fails, but a busy one may too, so it serves readiness, not liveness. This endpoint reads what each
scheduler process last reported of its own loop:

    scheduler side  every pass of the scheduler's loop (AFTER `Scheduler.ingest_requests`, which every loop calls
                    each iteration; an idle loop still passes at least once a second: SGLang's idle sleeper polls
                    with a 1 s timeout) notes it ran; at most once a second it writes a heartbeat file
                    {beat, progress, queued}: when it last ran, when it last made progress (ran a forward, or had
                    nothing to do) and how many requests wait or run
    HTTP side       GET /liveness reads the heartbeats: 503 naming the scheduler when one has not run its loop
                    for `liveness_window` seconds (it stopped answering: SIGSTOP, a hung collective, a forward
                    that never returns), or has had work and run no forward for that long (it stopped making
                    progress); otherwise 200. Before any scheduler has reported (startup) it answers 200: the
                    startup probe covers that time.

The window must exceed the longest single forward (a long prefill); a long generation is many short forwards
and never comes near it. One definition of the window (`Liveness`, env_settings.py): `dspark serve
--liveness-window`, handed to SGLang's HTTP process in DSPARK_LIVENESS. The heartbeat folder is per SGLang start:
the launcher names it (under the temporary folder, by its pid) in DSPARK_HEARTBEAT_DIR before it starts the
schedulers, which inherit it. Under tensor parallelism the ranks run their loops in lockstep (every iteration
starts with rank 0's broadcast of the new requests), so one hung rank stalls them all; on a multi-node group the
HTTP process sees the heartbeats of its own node's ranks, which is enough for that reason.
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

    liveness_window: float = setting(300.0, "seconds a scheduler may go without running its loop, or with work "
                                     "and no forward, before GET /liveness fails (longer than the longest "
                                     "single forward)", float, low=1.0, high=86400.0)


class Heartbeat:
    """One scheduler process's heartbeat file (scheduler side; `folder` None: not a process SGLang started)."""

    def __init__(self, folder: Optional[Path]) -> None:
        self.folder = folder
        self.written = -math.inf
        self.forwards: Optional[int] = None  # the scheduler's forward count when last written
        self.progress: Optional[float] = None

    @classmethod
    def from_environment(cls) -> "Heartbeat":
        folder = os.environ.get(HEARTBEAT_DIR_ENV)
        return cls(Path(folder) if folder else None)

    def due(self, now: float) -> bool:
        return self.folder is not None and now - self.written >= BEAT_EVERY_S

    def write(self, forwards: int, queued: int, now: float) -> None:
        """The loop ran at `now` (time.monotonic(): one clock for every process of the host) having run
        `forwards` forwards in all, with `queued` requests waiting or running."""
        if forwards != self.forwards or queued == 0:
            self.forwards, self.progress = forwards, now
        path = self.folder / f"scheduler-{os.getpid()}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"pid": os.getpid(), "beat": now, "progress": self.progress,
                                         "queued": queued}))
        temporary.replace(path)
        self.written = now


def problems(beats: list[dict], window: float, now: float) -> list[str]:
    """What is hung, by the heartbeats `beats` (Heartbeat's files) at `now`; empty: alive."""
    found = []
    for beat in beats:
        silent, stalled = now - beat["beat"], now - beat["progress"]
        if silent > window:
            found.append(f"scheduler {beat['pid']} has not run its loop for {silent:.0f} s "
                         f"(liveness_window {window:g} s)")
        elif beat["queued"] and stalled > window:
            found.append(f"scheduler {beat['pid']} has {beat['queued']} requests and has run no forward for "
                         f"{stalled:.0f} s (liveness_window {window:g} s)")
    return found


def read_beats(folder: Path) -> list[dict]:
    beats = []
    for path in sorted(folder.glob("scheduler-*.json")):
        try:
            beats.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # replaced or removed while read: the next probe reads it again
            continue
    return beats


def _on_loop(state: SchedulerState, result, scheduler, *args, **kwargs) -> None:
    now = time.monotonic()
    if state.heartbeat.due(now):
        state.heartbeat.write(scheduler.forward_ct, len(scheduler.waiting_queue) + len(scheduler.running_batch.reqs),
                              now)


def _add_route(window: float, *args, **kwargs) -> None:
    from fastapi.responses import JSONResponse
    from sglang.srt.entrypoints.http_server import app

    folder = Path(os.environ[HEARTBEAT_DIR_ENV])

    async def dspark_liveness() -> JSONResponse:
        beats = read_beats(folder)
        found = problems(beats, window, time.monotonic())
        return JSONResponse({"alive": not found, "schedulers": len(beats), "problems": found},
                            status_code=503 if found else 200)

    app.add_api_route("/liveness", dspark_liveness, methods=["GET"])


def heartbeat_folder() -> Path:
    """The launcher's fresh heartbeat folder, named in the environment its schedulers inherit."""
    folder = Path(tempfile.gettempdir()) / f"dspark-heartbeats-{os.getpid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    for stale in folder.glob("scheduler-*"):  # a pid reused from an earlier start
        stale.unlink(missing_ok=True)
    os.environ[HEARTBEAT_DIR_ENV] = str(folder)
    return folder


def install(state: SchedulerState) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if multiprocessing.parent_process() is None:  # the launcher: SGLang's HTTP app, before any scheduler starts
        window = Liveness.from_env().liveness_window  # a bad hand-over stops the launch here, naming it
        heartbeat_folder()
        HookRegistry.register("sglang.srt.entrypoints.http_server.launch_server", partial(_add_route, window),
                              HookType.BEFORE)
    elif HEARTBEAT_DIR_ENV in os.environ:  # a scheduler (the detokenizer never runs this loop)
        HookRegistry.register(f"{SCHEDULER}.ingest_requests", partial(_on_loop, state), HookType.AFTER)
