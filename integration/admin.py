"""The runtime state over SGLang's admin endpoints: `/set_internal_state` and `/get_server_info`.

    POST /set_internal_state {"server_args": {"dspark": {"policy": "threshold", "threshold": 0.4}}}
      -> {"updated": true}, or {"updated": false} with nothing changed when the merged state is invalid
    GET /get_server_info -> internal_states[i]["dspark"] = the state, its version, gamma, last_rejection,
                            and the mean verify budget of the rounds since the last change

Both go through SGLang's scheduler-side controller (`SchedulerInternalStateController`), which runs in
the scheduler's own loop, so an update lands between rounds. The gRPC control plane drives the same key.
SGLang types the request body as numbers only (`Dict[str, Union[int, float]]`); the plugin replaces the
request class with one that also carries the `dspark` object (admin_request.py).
"""
from __future__ import annotations

from dspark.integration import planner
from dspark.models.errors import ConfigError

KEY = "dspark"
CONTROLLER = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"


def _validate(key: str, value) -> None:
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

    if planner.store is None:
        raise UpdateRejected(f"{key} requires a DSpark draft worker with dspark's planner "
                             f"(--speculative-algorithm DSPARK and a ragged verify mode)")
    try:
        planner.store.check(value)
    except ConfigError as err:
        raise UpdateRejected(str(err)) from None


def _apply(key: str, value) -> None:
    planner.store.update(value)
    planner.trace.reset()  # budgets are reported per state


def _with_dspark_handler(original, controller):
    from sglang.srt.managers.scheduler_components.internal_state import _UpdateHandler

    return {**original(controller), KEY: _UpdateHandler(_validate, _apply)}


def _report(result, controller, state: dict) -> None:
    if planner.store is not None:
        state[KEY] = {**planner.store.report(), **planner.trace.report()}


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from dspark.integration.admin_request import SetInternalStateWithDsparkReq

    HookRegistry.register("sglang.srt.managers.io_struct.SetInternalStateReq", SetInternalStateWithDsparkReq,
                          HookType.REPLACE)
    HookRegistry.register(f"{CONTROLLER}._update_handlers", _with_dspark_handler, HookType.AROUND)
    HookRegistry.register(f"{CONTROLLER}._add_speculative", _report, HookType.AFTER)
