"""The dspark.admin.v1 Admin servicer: thin RPC handlers over the replica backend (backend.py).

Reads (GetState, History, WatchState) need a reader or admin credential; changes (UpdateState, Rollback,
ProfileSps, Calibrate, Restart, LoadDrafter) need an admin one, pass the per-caller rate limit, and each attempt is audited whatever its
outcome. A change is one envelope-form `dspark` update (integration/runtime_state.py), so validation,
versioning and history happen in the schedulers, atomically. Status codes:

    INVALID_ARGUMENT    a value out of range, an unknown field or one of the wrong wire type in any request message
                        (wire.py: checked once the caller is authorized, before anything is read or applied),
                        an unknown mask path, an empty mask,
                        an sps_table outside the SPS directories or one that cannot be read as a table,
                        min_samples outside 1..the window's size (0: the default), WatchState's interval_s
                        outside its bounds (streams.py; 0: 1 s), Restart's timeout_s outside
                        [0, MAX_RESTART_TIMEOUT_S] (restart.py; 0: DEFAULT_RESTART_TIMEOUT_S)
    ABORTED             expected_version is not the current version (read again, redo the change)
                        (Calibrate with too few labelled rounds in the window: INVALID_ARGUMENT, naming the count)
    UNAUTHENTICATED     no valid token or client certificate
    PERMISSION_DENIED   a reader called a change
    RESOURCE_EXHAUSTED  over the caller's update rate; a WatchState beyond the streams' bounds (streams.py)
    UNAVAILABLE         the SGLang server did not answer
    FAILED_PRECONDITION Restart on an admin server that has no supervisor
    DEADLINE_EXCEEDED   Restart: the replica did not serve again within the request's timeout

A WatchState stream sleeps on an Event that the client's cancel and the server's stop (`stop`) set, as does
Restart's wait, so that stopping the server never waits out an interval.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

import grpc
from google.protobuf.message import Message

from dspark.integration.runtime_state import PREVIOUS, VersionConflict
from dspark.models.decoding.sps_profile import load_sps
from dspark.models.errors import SHOWN_CHARS, ConfigError, clipped
from dspark.ops.admin.backend import ReplicaUnavailable, SGLangBackend
from dspark.ops.admin.restart import RestartChannel, restart_timeout
from dspark.ops.admin.convert import drafter_message, message_to_settings, settings_to_message, state_message
from dspark.ops.admin.security import AuditLog, Caller, Denied, RateLimiter, TokenBook, authorize
from dspark.ops.admin.streams import Streams, StreamsFull, watch_interval
from dspark.ops.admin.tracing import rpc_span
from dspark.ops.admin.v1 import admin_pb2 as pb
from dspark.ops.admin.v1 import admin_pb2_grpc
from dspark.ops.admin.wire import Unparsed

DEFAULT_CALIBRATION_SAMPLES = 64
DEFAULT_SPS_SAMPLES = 256
RESTART_POLL_S = 0.5
MAX_DETAIL_CHARS = 1024  # a refusal's reason (gRPC trailers hold 8 KiB in all by default)

T = TypeVar("T")


class RestartTimeout(Exception):
    """The replica did not serve again in time after a restart."""


def traced(handler):
    """Run an RPC handler (unary or streaming) inside its span, under the caller's trace (tracing.py)."""
    def attributes(service):
        return {"rpc.system": "grpc", "rpc.method": handler.__name__, "dspark.replica": service.backend.url}

    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def stream(self, request, context):
            with rpc_span(handler.__name__, context.invocation_metadata(), attributes(self)):
                yield from handler(self, request, context)
        return stream

    @functools.wraps(handler)
    def unary(self, request, context):
        with rpc_span(handler.__name__, context.invocation_metadata(), attributes(self)):
            return handler(self, request, context)
    return unary


@dataclass
class AdminService(admin_pb2_grpc.AdminServicer):
    backend: SGLangBackend
    tokens: TokenBook
    limiter: RateLimiter
    audit: AuditLog
    restarts: Optional[RestartChannel] = None  # to the `dspark serve` that supervises SGLang (restart.py)
    streams: Streams = field(default_factory=Streams)
    stopping: threading.Event = field(default_factory=threading.Event)
    changing: threading.Lock = field(default_factory=threading.Lock)  # one change and its audit line at a time

    def stop(self) -> None:
        """The server is stopping: wake every stream and Restart wait, and admit no more streams."""
        self.stopping.set()
        self.streams.close_all()

    # ------------------------------------------------------------------ reads

    @traced
    def GetState(self, request, context):
        self.reader(context, "GetState", request)
        return state_message(self.report(context))

    @traced
    def History(self, request, context):
        self.reader(context, "History", request)
        return pb.HistoryResponse(entries=[
            pb.HistoryEntry(version=c["version"], caller=c["caller"], time_unix_s=c["time"], action=c["action"],
                            settings=settings_to_message(c["state"]))
            for c in self.report(context)["history"]])

    @traced
    def WatchState(self, request, context):
        caller, request = self.reader(context, "WatchState", request)
        try:
            interval = watch_interval(request.interval_s)
            slot = self.streams.admit(caller.name)
        except ConfigError as err:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except StreamsFull as full:
            abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(full))
        context.add_callback(slot.wake.set)  # the client cancelled, or the call ended
        try:
            previous = self.report(context)
            yield pb.WatchEvent(state=state_message(previous))
            while context.is_active() and not slot.wake.wait(interval):
                report = self.report(context)
                event = pb.WatchEvent(stats=interval_stats(previous, report, interval))
                if report["version"] != previous["version"]:
                    event.state.CopyFrom(state_message(report))
                yield event
                previous = report
        finally:
            self.streams.release(slot)

    # ---------------------------------------------------------------- changes

    @traced
    def UpdateState(self, request, context):
        def envelope(caller: Caller, request: pb.UpdateStateRequest) -> dict:
            paths = list(request.update_mask.paths)
            if not paths:
                raise ConfigError("update_mask is empty: name the settings to change")
            return {"set": message_to_settings(request.settings, paths), "caller": caller.name,
                    "validate_only": request.validate_only, **expected(request)}
        return self.change(context, "UpdateState", request, envelope)

    @traced
    def Rollback(self, request, context):
        def envelope(caller: Caller, request: pb.RollbackRequest) -> dict:
            to = request.to_version if request.HasField("to_version") else PREVIOUS
            return {"rollback_to": to, "caller": caller.name, **expected(request)}
        return self.change(context, "Rollback", request, envelope)

    @traced
    def ProfileSps(self, request, context):
        def envelope(caller: Caller, request: pb.ProfileSpsRequest) -> dict:
            # The schedulers fit the table to traffic, or measure it with SGLang's own forward between rounds, and
            # write it (integration/refit.py, integration/sps_forward.py): no second copy of the target anywhere
            if request.from_traffic:
                return {"refit_sps": {"min_samples": request.min_samples or DEFAULT_SPS_SAMPLES},
                        "caller": caller.name}
            return {"profile_sps": {}, "caller": caller.name}
        response = self.change(context, "ProfileSps", request, envelope)
        path = response.state.settings.sps_table
        table = load_sps(path)
        return pb.ProfileSpsResponse(state=response.state, sps_table=path,
                                     sample_batch_tokens=table.sample_batch_tokens,
                                     sample_steps_per_sec=table.sample_steps_per_sec)

    @traced
    def Calibrate(self, request, context):
        captured: dict = {}

        def envelope(caller: Caller, request: pb.CalibrateRequest) -> dict:
            captured["before"] = self.backend.report()["calibration"]  # authorized by now
            return {"refit_sts": {"min_samples": request.min_samples or DEFAULT_CALIBRATION_SAMPLES},
                    "caller": caller.name, **expected(request)}
        response = self.change(context, "Calibrate", request, envelope)
        before = captured["before"]
        return pb.CalibrateResponse(state=response.state, samples=before["samples"],
                                    ece_before=[nan_for_null(e) for e in before["ece"]])

    @traced
    def Restart(self, request, context):
        if self.restarts is None:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, "this admin server was not started by `dspark "
                                                                "serve`: nothing here can restart SGLang")
        began = time.monotonic()

        def restart(_caller: Caller, request: pb.RestartRequest) -> tuple[dict, dict, int]:
            timeout = restart_timeout(request.timeout_s)
            before = self.backend.report()
            starts = self.restarts.starts()
            self.restarts.request()
            while self.restarts.starts() == starts or not self.backend.ready():
                if time.monotonic() - began > timeout:
                    raise RestartTimeout(f"the replica did not serve again within {timeout:g} s")
                if self.stopping.wait(RESTART_POLL_S):
                    raise ReplicaUnavailable("the admin server is stopping; the restart goes on without it")
            return before, self.backend.report(), self.restarts.starts()
        audit, (before, after, starts) = self.attempt(context, "Restart", request, restart)
        seconds = time.monotonic() - began
        self.audit.record(**audit, result="restarted", version_before=before["version"],
                          version_after=after["version"], detail=f"serving again after {seconds:.1f} s")
        return pb.RestartResponse(state=state_message(after), seconds=seconds, starts=starts)

    @traced
    def LoadDrafter(self, request, context):
        def load(caller: Caller, parsed: pb.LoadDrafterRequest) -> dict:
            with self.changing:  # one change and its audit line at a time
                outcome = self.backend.load_drafter(parsed.path)
                before, after = outcome["previous"], outcome["drafter"]
                self.audit.record(**audit_fields(context, "LoadDrafter", caller.name), result="applied",
                                  before={"drafter": before["version"], "drafter_path": before["path"]},
                                  after={"drafter": after["version"], "drafter_path": after["path"]},
                                  detail=f"loaded in {outcome['seconds']:.2f} s")
            return outcome
        _, outcome = self.attempt(context, "LoadDrafter", request, load)
        return pb.LoadDrafterResponse(drafter=drafter_message(outcome["drafter"]),
                                      previous=drafter_message(outcome["previous"]), seconds=outcome["seconds"])

    # ---------------------------------------------------------------- helpers

    def reader(self, context, rpc: str, request: Unparsed) -> tuple[Caller, Message]:
        """The caller of a read and its request, parsed strictly; else the RPC is aborted (not audited)."""
        try:
            return authorize(self.tokens, context, rpc), request.parse()
        except Denied as denied:
            abort(context, denied.code, denied.reason)
        except ConfigError as err:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))

    def report(self, context) -> dict:
        try:
            return self.backend.report()
        except ReplicaUnavailable as err:
            abort(context, grpc.StatusCode.UNAVAILABLE, str(err))

    def attempt(self, context, rpc: str, request: Unparsed, action: Callable[[Caller, Message], T]) -> tuple[dict, T]:
        """Authorize and rate-limit a change, parse its request strictly, then run action(caller, request): (its
        audit fields, its result). A refusal or failure is audited and aborts the RPC with the status of the module
        docstring."""
        audit = audit_fields(context, rpc, "anonymous")
        try:
            caller = authorize(self.tokens, context, rpc)
            audit["caller"] = caller.name
            if not self.limiter.allow(caller.name):
                raise Denied(grpc.StatusCode.RESOURCE_EXHAUSTED, f"update rate limit ({self.limiter.rate}/s, "
                                                                 f"burst {self.limiter.burst}) exceeded", caller.name)
            return audit, action(caller, request.parse())
        except Denied as denied:
            self.refuse(context, {**audit, "caller": denied.caller}, denied.code, denied.reason)
        except VersionConflict as err:
            self.refuse(context, audit, grpc.StatusCode.ABORTED, str(err))
        except ConfigError as err:
            self.refuse(context, audit, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except ReplicaUnavailable as err:
            self.refuse(context, audit, grpc.StatusCode.UNAVAILABLE, str(err))
        except RestartTimeout as err:
            self.refuse(context, audit, grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
        except Exception as err:  # a failed profile, say: still one audit line, and the caller learns why
            self.refuse(context, audit, grpc.StatusCode.INTERNAL,
                        clipped(f"{type(err).__name__}: {err}", SHOWN_CHARS))

    def change(self, context, rpc: str, request: Unparsed,
               envelope: Callable[[Caller, Message], dict]) -> pb.UpdateStateResponse:
        """Apply and audit one envelope-form change (see attempt). The audit line's version and settings before are
        what the schedulers replaced, as they answer (runtime_state.py `install`), and one change and its line are
        written at a time (`changing`), so the lines come in version order and chain."""
        def apply(caller: Caller, parsed: Message) -> dict:
            with self.changing:
                outcome = self.backend.update(envelope(caller, parsed))
                self.audit.record(**audit_fields(context, rpc, caller.name),
                                  result="applied" if outcome["applied"] else "validated",
                                  before=outcome["state_before"], after=outcome["state"],
                                  version_before=outcome["version_before"], version_after=outcome["version"])
            return outcome
        _, outcome = self.attempt(context, rpc, request, apply)
        state = state_message({**outcome["state"], "version": outcome["version"], "gamma": outcome["gamma"]})
        return pb.UpdateStateResponse(state=state, applied=outcome["applied"])

    def refuse(self, context, audit: dict, code: grpc.StatusCode, reason: str) -> None:
        self.audit.record(**audit, result=code.name.lower(), detail=reason)
        abort(context, code, reason)


def audit_fields(context, rpc: str, caller: str) -> dict:
    return dict(rpc=rpc, caller=caller, peer=context.peer())


def abort(context, code: grpc.StatusCode, reason: str) -> None:
    """End the RPC with `code` and `reason`, clipped to MAX_DETAIL_CHARS: the values a reason quotes are clipped
    where it is written (models/errors.py `shown`), and this bounds the whole, which travels in the trailers."""
    context.abort(code, clipped(reason, MAX_DETAIL_CHARS))


def expected(request) -> dict:
    return {"expected_version": request.expected_version} if request.HasField("expected_version") else {}


def interval_stats(before: dict, after: dict, interval_s: float) -> pb.ServingStats:
    """Serving stats between two reports, from the schedulers' counters since start (admin.py `totals`; SGLang
    zeroes its own on some resets, so a negative difference counts as nothing)."""
    delta = {key: max(0, after["totals"][key] - before["totals"][key]) for key in after["totals"]}
    return pb.ServingStats(
        interval_s=interval_s, rounds=delta["rounds"], drafts_verified=delta["drafts"],
        tau=delta["accepted_tokens"] / delta["verify_forwards"] if delta["verify_forwards"] > 0 else 0.0,
        verify_budget_per_request=delta["drafts"] / delta["requests"] if delta["requests"] > 0 else 0.0,
        goodput_tok_s=after.get("last_gen_throughput", 0.0), step_overhead_s=after.get("step_overhead_s", 0.0),
        state_version=after["version"], calibration_samples=after["calibration"]["samples"],
        ece_by_position=[nan_for_null(e) for e in after["calibration"]["ece"]],
        survival_gap_by_position=[nan_for_null(g) for g in after["calibration"]["survival_gap"]],
        probe_rounds=delta["probe_rounds"], sps_table_error_ratio=nan_for_null(after["sps_fit"]["error_ratio"]))


def nan_for_null(value) -> float:
    return float("nan") if value is None else value
