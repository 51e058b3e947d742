"""The runtime state over SGLang's admin endpoints: `/set_internal_state` and `/get_server_info`.

    POST /set_internal_state {"server_args": {"dspark": {"policy": "threshold", "threshold": 0.4}}}
      -> [true], or HTTP 400 {"object": "error", "message": "<what is wrong>", ...} (SGLang's error body) with
         nothing changed when the merged state is invalid
    POST /set_internal_state {"server_args": {"dspark": {"refit_sts": {"min_samples": 64}, "caller": "x"}}}
      -> as below, with the STS temperatures refitted on the live calibration window (refit.py; refit_sps:
         the SPS table fitted to the measured round costs)
    POST /set_internal_state {"server_args": {"dspark": {"set": {...}, "expected_version": 3, "caller": "x"}}}
      -> [{"applied": true, "version": 4, "state": {...}}] per scheduler; HTTP 409 when version 3 is no longer
         current (the envelope forms, rollbacks and validate_only: runtime_state.py)
    GET /get_server_info -> internal_states[i]["dspark"] = the state, its version, gamma, last_rejection, the
                            kept history, the mean verify budget of the rounds since the last change, the
                            counters since start (`totals`, for per-interval stats), the measured
                            per-round overhead the SPS policies add to the table and how far the table
                            is from the measured round times (`sps_fit`, models/decoding/round_cost.py), and
                            the live calibration (`calibration`)

Both go through SGLang's scheduler-side controller (`SchedulerInternalStateController`), which runs in
the scheduler's own loop, so an update lands between rounds; under tensor parallelism TP rank 0 receives the
request and hands it to every rank before the same loop iteration. The gRPC control plane (ops/admin/) drives
the same key with the envelope form.
SGLang types the request body as numbers only (`Dict[str, Union[int, float]]`); the plugin replaces the
request class with one that also carries the `dspark` object (admin_request.py). SGLang answers a refused
update with a bare `false` (the reason goes to the scheduler's log); for the `dspark` key the reason
travels back with the reply and the endpoint answers 400 with it (409 for a version conflict). SGLang lets
any other exception of a handler out of the scheduler's loop, which kills the scheduler, so the dspark handler
refuses an update whose check raised anything at all, and its apply installs what the check compiled.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from dspark.integration import capture, drafter_swap, metrics
from dspark.integration.refit import with_refit
from dspark.integration.runtime_state import VersionConflict
from dspark.models.errors import ConfigError

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

logger = logging.getLogger(__name__)

KEY = "dspark"
CONTROLLER = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"


def _validate(state: SchedulerState, key: str, value) -> None:
    """Refuse an update SGLang must not apply. SGLang lets any exception but UpdateRejected out of the
    scheduler's loop, which kills the scheduler, so one that checking raised unexpectedly refuses the update too
    (logged here, not echoed: its message may quote what it read). What it checked, or why it refused, goes into
    `state.update` for the apply and the reply."""
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

    update = state.update
    if state.store is None:
        update.refusal = (f"{key} requires a DSpark draft worker with dspark's planner "
                          f"(--speculative-algorithm DSPARK and a ragged verify mode)")
        raise UpdateRejected(update.refusal)
    try:
        update.checked = state.store.check(with_refit(state, value))
        return
    except ConfigError as err:
        update.refusal, update.conflict = str(err), isinstance(err, VersionConflict)
    except Exception as err:  # a bug, not the caller's doing: keep serving on the state in effect
        logger.exception("dspark: checking a runtime state update failed")
        update.refusal, update.conflict = (f"dspark runtime state update rejected: it could not be checked "
                                           f"({type(err).__name__}; see the server log)"), False
        state.store.last_rejection = update.refusal
    metrics.observe_update("conflict" if update.conflict else "refused")
    raise UpdateRejected(update.refusal)


def _reply_with_reason(state: SchedulerState, original, controller, recv_req):
    """Scheduler side: a refused dspark update's reply carries the reason."""
    import msgspec

    from dspark.integration.admin_request import AppliedInternalStateReqOutput, RejectedInternalStateReqOutput
    from dspark.integration.scheduler_state import UpdateInFlight

    state.update = update = UpdateInFlight()
    alone = drafter_swap.refuse_with_others(recv_req.server_args)
    if alone is not None:  # a drafter swap changes nothing else with it (drafter_swap.py)
        return RejectedInternalStateReqOutput(updated=False, reason=alone)
    reply = original(controller, recv_req)
    fields = msgspec.structs.asdict(reply)
    if reply.updated:
        return reply if update.applied is None else AppliedInternalStateReqOutput(**fields, dspark=update.applied)
    if update.refusal is None:
        return reply
    return RejectedInternalStateReqOutput(**fields, reason=update.refusal, conflict=update.conflict)


async def _answer_400_with_reason(original, manager, obj):
    """HTTP side: SGLang's own answer ([true] / [false] per scheduler), each scheduler's outcome for an
    envelope-form dspark update, or 400 (409: a version conflict) naming why dspark refused."""
    from fastapi import HTTPException

    manager.auto_create_handle_loop()
    replies = await manager.set_internal_state_communicator(obj)
    reasons = [reply.reason for reply in replies if getattr(reply, "reason", None)]
    if reasons:
        conflict = any(getattr(reply, "conflict", False) for reply in replies)
        raise HTTPException(status_code=409 if conflict else 400, detail="; ".join(dict.fromkeys(reasons)))
    answers = [getattr(reply, "dspark", None) or reply.updated for reply in replies]
    if drafter_swap.KEY in obj.server_args and isinstance(answers[0], dict):
        capture.drafter_swapped(answers[0]["drafter"])  # this process's capture records the new version
    return answers


def _apply(state: SchedulerState, key: str, value) -> None:
    checked = state.update.checked
    outcome = state.store.install(*checked)  # as _validate resolved, checked and compiled it
    metrics.observe_update("applied" if outcome["applied"] else "validated")
    if outcome["applied"]:
        state.trace.reset()  # budgets are reported per state
    if checked[1].envelope:  # the envelope form (a refit included) answers with what it did
        state.update.applied = outcome


def _with_dspark_handler(state: SchedulerState, original, controller):
    from sglang.srt.managers.scheduler_components.internal_state import _UpdateHandler

    return {**original(controller), KEY: _UpdateHandler(partial(_validate, state), partial(_apply, state)),
            drafter_swap.KEY: drafter_swap.handler(state)}


def _report(state: SchedulerState, result, controller, internal: dict) -> None:
    if state.store is not None:
        # SGLang's acceptance counters: the lifetime totals move once per decode log interval, the current
        # interval's counts every round; their sum is up to date.
        reporter = controller.scheduler.metrics_reporter
        totals = {**state.trace.totals(),
                  "accepted_tokens": reporter.spec_total_num_accept_tokens + reporter.spec_num_accept_tokens,
                  "verify_forwards": reporter.spec_total_num_forward_ct + reporter.spec_num_forward_ct}
        internal[KEY] = {**state.store.report(), **state.trace.report(), "totals": totals,
                         "sps_table_source": state.sps_source(state.store.planner.state.sps_table),
                         "step_overhead_s": state.clock.overhead(), "sps_fit": sps_fit(state),
                         "calibration": state.calibration.report(state.head_temperatures),
                         "drafter": drafter_swap.served_drafter(state)}


def sps_fit(state: SchedulerState) -> dict:
    """The live round-cost window against the table in use (models/decoding/round_cost.py)."""
    table, costs = state.sps_table(), state.clock.costs
    return {"samples": len(costs.samples),
            "error_ratio": costs.error(table, state.clock.overhead()) if table is not None else None}


def install(state: SchedulerState) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from dspark.integration.admin_request import SetInternalStateWithDsparkReq
    HookRegistry.register("sglang.srt.managers.io_struct.SetInternalStateReq", SetInternalStateWithDsparkReq,
                          HookType.REPLACE)
    HookRegistry.register(f"{CONTROLLER}._update_handlers", partial(_with_dspark_handler, state), HookType.AROUND)
    HookRegistry.register(f"{CONTROLLER}._add_speculative", partial(_report, state), HookType.AFTER)
    HookRegistry.register(f"{CONTROLLER}.set_internal_state", partial(_reply_with_reason, state), HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.set_internal_state",
                          _answer_400_with_reason, HookType.AROUND)
