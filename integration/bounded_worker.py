"""Work a client's request can make arbitrarily slow, run in a worker process with a time bound that stops it.

A thread cannot be stopped and, running Python (a tool parser's regular expressions) or holding the GIL, it
still blocks SGLang's HTTP event loop; a process can be killed. `BoundedWorker` keeps one child process
(`python -m dspark.integration.bounded_worker`, a fresh interpreter: nothing of the server is forked),
made ready once by `setup(*setup_args)` (a tokenizer, a grammar compiler) in the child, and runs each call there
one at a time: `await worker.call(task, payload, timeout_s)`. The event loop only waits. A call past its bound
kills the process, so the work itself stops, and the next call starts a fresh one. At most MAX_WAITING calls
wait for the process; more are refused at once (`Busy`).

`setup` and every `task` are module-level functions (the child imports them by name); a task gets the setup's
result and the payload and returns something picklable.
"""
from __future__ import annotations

import asyncio
import os
import pickle
import select
import subprocess
import sys
from typing import Any, Callable

from dspark.models.errors import clipped

MAX_WAITING = 8
START_TIMEOUT_S = 300.0  # the child imports SGLang and loads a tokenizer: slow on a busy CPU, once
LENGTH_BYTES = 8


class TimedOut(Exception):
    pass


class Busy(Exception):
    pass


class TaskFailed(Exception):
    """The task raised (on what it was given)."""


class WorkerLost(Exception):
    """The worker could not start, or died under a task."""


def write_message(stream, message: Any) -> None:
    data = pickle.dumps(message)
    stream.write(len(data).to_bytes(LENGTH_BYTES, "big") + data)
    stream.flush()


def read_message(stream) -> Any:
    """One message from the other side (only ever this module's own pickles); EOFError when it is gone."""
    head = stream.read(LENGTH_BYTES)
    if len(head) < LENGTH_BYTES:
        raise EOFError
    data = stream.read(int.from_bytes(head, "big"))
    return pickle.loads(data)


def serve() -> None:
    """The child (`python -m dspark.integration.bounded_worker`): set up once, then answer ('ok', result) or
    ('error', message) per task. Its stdout is the channel, so whatever the libraries print goes to stderr."""
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    setup, setup_args = read_message(requests)
    try:
        state = setup(*setup_args)
    except Exception as err:
        write_message(channel, ("lost", f"setting up failed: {type(err).__name__}: {clipped(str(err), 300)}"))
        return
    write_message(channel, ("ok", None))
    while True:
        try:
            task, payload = read_message(requests)
        except EOFError:
            return
        try:
            write_message(channel, ("ok", task(state, payload)))
        except Exception as err:
            write_message(channel, ("error", f"{type(err).__name__}: {clipped(str(err), 300)}"))


def readable(stream, timeout_s: float) -> bool:
    return bool(select.select([stream], [], [], timeout_s)[0])


class BoundedWorker:
    def __init__(self, setup: Callable, setup_args: tuple):
        self.setup, self.setup_args = setup, setup_args
        self.process = None
        self.lock = asyncio.Lock()
        self.waiting = 0

    async def call(self, task: Callable, payload: Any, timeout_s: float) -> Any:
        if self.waiting >= MAX_WAITING:
            raise Busy(f"{self.waiting} calls are waiting for the worker already")
        self.waiting += 1
        try:
            async with self.lock:
                await self.started()
                write_message(self.process.stdin, (task, payload))
                if not await asyncio.to_thread(readable, self.process.stdout, timeout_s):
                    self.kill()
                    raise TimedOut(f"it ran past {timeout_s:g} s and was stopped")
                return await asyncio.to_thread(self.answer)
        finally:
            self.waiting -= 1

    async def started(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.process = subprocess.Popen([sys.executable, "-m", "dspark.integration.bounded_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        write_message(self.process.stdin, (self.setup, self.setup_args))
        if not await asyncio.to_thread(readable, self.process.stdout, START_TIMEOUT_S):
            self.kill()
            raise WorkerLost(f"the worker did not start within {START_TIMEOUT_S:g} s")
        await asyncio.to_thread(self.answer)

    def answer(self) -> Any:
        try:
            status, value = read_message(self.process.stdout)
        except EOFError:  # the child died (killed for memory, say)
            self.kill()
            raise WorkerLost("the worker process died") from None
        if status == "lost":
            self.kill()
            raise WorkerLost(value)
        if status == "error":
            raise TaskFailed(value)
        return value

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
        self.process = None


if __name__ == "__main__":
    serve()
