"""The runtime state over SGLang's admin endpoints: `/set_internal_state` and `/get_server_info`.

    POST /set_internal_state {"server_args": {"dspark": {"policy": "threshold", "threshold": 0.4}}}
      -> [true], or HTTP 400 {"object": "error", "message": "<what is wrong>", ...} (SGLang's error body) with
         nothing changed when the merged state is invalid
    GET /get_server_info -> internal_states[i]["dspark"] = the state, its version, gamma, last_rejection,
                            the mean verify budget of the rounds since the last change, and the measured
                            per-round overhead the SPS policies add to the table (planner.RoundClock)

Both go through SGLang's scheduler-side controller (`SchedulerInternalStateController`), which runs in
the scheduler's own loop, so an update lands between rounds. The gRPC control plane drives the same key.
SGLang types the request body as numbers only (`Dict[str, Union[int, float]]`); the plugin replaces the
request class with one that also carries the `dspark` object (admin_request.py). SGLang answers a refused
update with a bare `false` (the reason goes to the scheduler's log); for the `dspark` key the reason
travels back with the reply and the endpoint answers 400 with it.
"""
from __future__ import annotations

from typing import Optional

from dspark.integration import planner
from dspark.models.errors import ConfigError

KEY = "dspark"
CONTROLLER = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"


# The reason the current /set_internal_state call refused the dspark key (scheduler process; one call at a time).
_refusal: Optional[str] = None


def _validate(key: str, value) -> None:
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

    global _refusal
    if planner.store is None:
        _refusal = (f"{key} requires a DSpark draft worker with dspark's planner "
                    f"(--speculative-algorithm DSPARK and a ragged verify mode)")
        raise UpdateRejected(_refusal)
    try:
        planner.store.check(value)
    except ConfigError as err:
        _refusal = str(err)
        raise UpdateRejected(_refusal) from None


def _reply_with_reason(original, controller, recv_req):
    """Scheduler side: a refused dspark update's reply carries the reason."""
    import msgspec

    from dspark.integration.admin_request import RejectedInternalStateReqOutput

    global _refusal
    _refusal = None
    reply = original(controller, recv_req)
    if reply.updated or _refusal is None:
        return reply
    return RejectedInternalStateReqOutput(**msgspec.structs.asdict(reply), reason=_refusal)


async def _answer_400_with_reason(original, manager, obj):
    """HTTP side: SGLang's own answer ([true] / [false] per scheduler), or 400 naming why dspark refused."""
    from fastapi import HTTPException

    manager.auto_create_handle_loop()
    replies = await manager.set_internal_state_communicator(obj)
    reasons = [reply.reason for reply in replies if getattr(reply, "reason", None)]
    if reasons:
        raise HTTPException(status_code=400, detail="; ".join(dict.fromkeys(reasons)))
    return [reply.updated for reply in replies]


def _apply(key: str, value) -> None:
    planner.store.update(value)
    planner.trace.reset()  # budgets are reported per state


def _with_dspark_handler(original, controller):
    from sglang.srt.managers.scheduler_components.internal_state import _UpdateHandler

    return {**original(controller), KEY: _UpdateHandler(_validate, _apply)}


def _report(result, controller, state: dict) -> None:
    if planner.store is not None:
        state[KEY] = {**planner.store.report(), **planner.trace.report(), "step_overhead_s": planner.clock.overhead()}


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from dspark.integration.admin_request import SetInternalStateWithDsparkReq

    HookRegistry.register("sglang.srt.managers.io_struct.SetInternalStateReq", SetInternalStateWithDsparkReq,
                          HookType.REPLACE)
    HookRegistry.register(f"{CONTROLLER}._update_handlers", _with_dspark_handler, HookType.AROUND)
    HookRegistry.register(f"{CONTROLLER}._add_speculative", _report, HookType.AFTER)
    HookRegistry.register(f"{CONTROLLER}.set_internal_state", _reply_with_reason, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.set_internal_state",
                          _answer_400_with_reason, HookType.AROUND)
