"""Opt-in capture of served traffic (`dspark serve --capture DIR`): each sampled reply of /generate,
/v1/completions and /v1/chat/completions, streamed or not, written as a `dspark regenerate` record with the
request's sampling settings, the served models' fingerprints and that request's live acceptance.

    where      ASGI middleware in SGLang's HTTP process, innermost of dspark's (request_gate.py adds it first):
               what it sees passed the drain, the API keys and the request gate. It copies the request body and
               the reply (a streamed reply's events; of a cumulative /generate stream the last one only) as they
               pass and, once a 200 reply has ended, offers the copy to the writer (capture_writer.py), which
               never makes the request wait
    which      a request with `X-Dspark-Capture: off` is never captured; of the others capture_rate, drawn from a
               generator seeded with capture_seed; a request or reply larger than a record may hold is not copied
    acceptance SGLang's tokenizer manager, BEFORE it handles each batch of outputs, hands the counts of the
               requests that finished (`FinishedCounts`): completion_tokens and spec_verify_ct (verify rounds),
               found again by the reply's id; accepted tokens per verify round = their ratio
    models     the target's and the drafter's paths and weight digests (models/target_io.py), computed once by
               the writer thread before its first record; after a drafter swap (drafter_swap.py) the drafter's
               is the one the schedulers loaded, from the record their reply carried (`drafter_swapped`)

Settings: capture_settings.py. What a record holds: capture_records.py. docs/traffic-loop.md
says what is stored, where, and who can read it.
"""
from __future__ import annotations

import atexit
import multiprocessing
import random
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Optional

from dspark.integration.capture_records import ROUTES, Exchange, Redactor, captured_record
from dspark.integration.capture_settings import CaptureSettings, checked_folder
from dspark.integration.capture_writer import REASONS, CaptureWriter
from dspark.integration.metrics import observe_capture_dropped, observe_capture_written
from dspark.models.jsonl import MAX_LINE_BYTES
from dspark.models.target_io import target_fingerprint

OPT_OUT_HEADER = b"x-dspark-capture"
MAX_REPLY_BYTES = 4 * MAX_LINE_BYTES  # a reply's JSON or events beyond the record they make (ids, usage, ...)
MAX_FINISHED = 4096  # finished requests' counts kept for their replies to find


class FinishedCounts:
    """(completion_tokens, spec_verify_ct) of the last MAX_FINISHED requests to finish, by rid: noted on the event
    loop, taken by the writer thread."""

    def __init__(self):
        self.counts: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.lock = threading.Lock()

    def note(self, _manager, recv_obj, *args, **kwargs) -> None:
        """BEFORE TokenizerManager._handle_batch_output(recv_obj)."""
        reasons, tokens = getattr(recv_obj, "finished_reasons", None), getattr(recv_obj, "completion_tokens", None)
        if not reasons or tokens is None:  # embeddings
            return
        verify = getattr(recv_obj, "spec_verify_ct", None) or [0] * len(reasons)
        with self.lock:
            for rid, reason, count, rounds in zip(recv_obj.rids, reasons, tokens, verify):
                if reason is not None:
                    self.counts[rid] = (int(count), int(rounds))
            while len(self.counts) > MAX_FINISHED:
                self.counts.popitem(last=False)

    def take(self, rid: Optional[str]) -> Optional[tuple[int, int]]:
        with self.lock:
            return self.counts.pop(rid, None) if isinstance(rid, str) else None


finished = FinishedCounts()  # this HTTP process's: the hook notes, the writer's records take


class TrafficCapture:
    """ASGI middleware: copy each sampled exchange of the captured routes and offer it to the writer."""

    def __init__(self, app, classify, settings: CaptureSettings, writer: CaptureWriter):
        self.app, self.classify, self.writer = app, classify, writer
        self.rate, self.draw = settings.capture_rate, random.Random(settings.capture_seed).random
        for reason in REASONS:  # listed on /metrics from the start (Starlette makes its middlewares as the app
            observe_capture_dropped(reason, 0)  # starts, once SGLang has set up the metrics)

    async def __call__(self, scope, receive, send):
        endpoint = self.classify.endpoint_name(scope) if scope["type"] == "http" else None
        if endpoint not in ROUTES or opted_out(scope) or not self.draw() < self.rate:
            return await self.app(scope, receive, send)
        incremental = incremental_streams()
        exchange = Exchange(endpoint, b"", incremental=incremental)
        copy = Copy(exchange, keep_last_event=endpoint == "generate_request" and not incremental)

        async def receive_copied():
            message = await receive()
            if message["type"] == "http.request":
                copy.request(message.get("body", b""))
            return message

        async def send_copied(message):
            copy.reply(message)
            await send(message)

        await self.app(scope, receive_copied, send_copied)
        if copy.too_large:
            self.writer.dropped("too_large")
        elif copy.answered:
            self.writer.offer(exchange)


class Copy:
    """What TrafficCapture keeps of one exchange as its messages pass."""

    def __init__(self, exchange: Exchange, keep_last_event: bool):
        self.exchange, self.keep_last_event = exchange, keep_last_event
        self.ok = self.answered = self.too_large = False
        self.partial = b""  # a streamed reply's text after its last complete event

    def request(self, body: bytes) -> None:
        self.exchange.request += body
        self.too_large = self.too_large or len(self.exchange.request) > MAX_LINE_BYTES

    def reply(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.ok = message["status"] == 200
            kind = dict(message.get("headers") or []).get(b"content-type", b"")
            self.exchange.streamed = kind.startswith(b"text/event-stream")
            return
        if message["type"] != "http.response.body" or not self.ok or self.too_large:
            return
        body = message.get("body", b"")
        if self.exchange.streamed:
            self.partial += body
            *complete, self.partial = self.partial.split(b"\n\n")
            data = [event[len(b"data: "):] for event in complete if event.startswith(b"data: ")]
            data = [d for d in data if d.strip() != b"[DONE]"]
            if self.keep_last_event and data:
                self.exchange.reply = data[-1:]  # each event of a cumulative stream holds the whole text so far
            else:
                self.exchange.reply.extend(data)
        else:
            self.exchange.reply.append(body)
        self.too_large = sum(len(part) for part in self.exchange.reply) + len(self.partial) > MAX_REPLY_BYTES
        self.answered = not message.get("more_body", False)


def opted_out(scope) -> bool:
    value = dict(scope.get("headers") or []).get(OPT_OUT_HEADER)
    return value is not None and value.strip().lower() == b"off"


@lru_cache(maxsize=1)
def incremental_streams() -> bool:
    """Whether SGLang streams /generate as each chunk's new text (--incremental-streaming-output), not the whole
    text so far (read at the first captured request: the tokenizer manager exists by then)."""
    from sglang.srt.entrypoints.http_server import _global_state

    return bool(_global_state.tokenizer_manager.incremental_streaming_output)


def model_version(path: Optional[str]) -> Optional[dict]:
    """A served model's path and the sha256 of its weights (None when it is not a local folder: a hub id)."""
    if path is None:
        return None
    folder = Path(path)
    return {"path": str(folder), "sha256": target_fingerprint(folder) if folder.is_dir() else None}


def served_models() -> dict:
    from sglang.srt.entrypoints.http_server import _global_state

    args = _global_state.tokenizer_manager.server_args
    drafter = args.speculative_draft_model_path if args.speculative_algorithm else None
    return {"target": model_version(args.model_path), "drafter": model_version(drafter)}


class ServedModels:
    """The models a record names: the served ones as SGLang started, fingerprinted once (by the writer thread, at
    its first record), with the drafter the schedulers last loaded in place of the started one."""

    def __init__(self):
        self.started: Optional[dict] = None
        self.swapped: Optional[dict] = None  # set on the event loop, read by the writer thread: one assignment

    def __call__(self) -> dict:
        if self.started is None:
            self.started = served_models()
        return self.started if self.swapped is None else {**self.started, "drafter": self.swapped}


served = ServedModels()  # this HTTP process's


def drafter_swapped(drafter: dict) -> None:
    """The schedulers loaded another drafter (admin.py, as their reply passes): records name it from now on."""
    served.swapped = {"path": drafter["path"], "sha256": drafter["version"]}


def add_capture(app, classify) -> None:
    """The middleware and its writer, when `dspark serve --capture` handed a folder over (request_gate.py calls
    this first among its middlewares: innermost)."""
    settings = CaptureSettings.from_env()
    if settings.capture is None:
        return
    redact = Redactor(settings.capture_redact or ())
    writer = CaptureWriter(checked_folder(settings.capture), settings,
                           lambda exchange: captured_record(exchange, redact, finished.take, served),
                           observe_capture_written, observe_capture_dropped)
    atexit.register(writer.close)
    app.add_middleware(TrafficCapture, classify=classify, settings=settings, writer=writer.start())


def install() -> None:
    if multiprocessing.parent_process() is not None:  # a scheduler or detokenizer: no HTTP app here
        return
    if CaptureSettings.from_env().capture is None:  # a bad hand-over stops the launch here, naming the setting
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_batch_output",
                          finished.note, HookType.BEFORE)
