"""`dspark serve`'s own liveness check of the SGLang it started: a stuck scheduler is killed, and started again,
without waiting for the kubelet.

Every CHECK_EVERY_S the watch reads the heartbeats of this SGLang start's schedulers (the files GET /liveness reads,
integration/liveness.py) and judges them with the same `problems`: a scheduler whose loop has not passed for
--liveness-step-bound seconds (for --liveness-window inside an admin request), or that has had work and run no
forward for --liveness-window seconds. When two checks in a row fail (one heartbeat write apart, so a file read
mid-replace cannot decide it), it calls `kill` with the problems: `dspark serve` kills SGLang's process tree (a
stuck or stopped scheduler does not drain) and then starts it again as after a crash, counted against
--max-restarts and in dspark_sglang_restarts. It reads files, not HTTP, so SGLang's --api-key cannot hide
/liveness from it. It judges nothing before this start of SGLang is `ready()` (GET /ready answered 200: the first
forwards of a start may compile kernels for minutes, which the kubelet's startup probe budgets, not the step
bound), nor while `paused()` (a drain, a restart in place, shutting down).
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Callable

from dspark.integration.liveness import BEAT_EVERY_S, Liveness, heartbeat_folder_of, problems, read_beats

CHECK_EVERY_S = BEAT_EVERY_S
FAILED_CHECKS = 2  # in a row, before SGLang is killed


def watch_liveness(server: subprocess.Popen, liveness: Liveness, ready: Callable[[], bool],
                   paused: Callable[[], bool], kill: Callable[[list[str]], None]) -> threading.Thread:
    """Check `server`'s schedulers from when it is ready until it exits; `kill(problems)` once they fail
    FAILED_CHECKS checks in a row."""
    folder = heartbeat_folder_of(server.pid)

    def watch() -> None:
        failed, started = 0, False
        while server.poll() is None:
            time.sleep(CHECK_EVERY_S)
            started = started or ready()
            found = [] if paused() or not started else problems(read_beats(folder), liveness, time.monotonic())
            failed = failed + 1 if found else 0
            if failed == FAILED_CHECKS:
                kill(found)
                break
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)  # that start's heartbeats; a fresh start names a fresh folder

    thread = threading.Thread(target=watch, name="sglang-liveness-watch", daemon=True)
    thread.start()
    return thread
