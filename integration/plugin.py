"""dspark's SGLang plugin, loaded by SGLang itself through the `sglang.srt.plugins` entry point.

SGLang calls `register()` early in every process it starts (launcher, scheduler, detokenizer), then
applies the hooks registered here; no SGLang source is patched or vendored. `register()` creates the process's
one `SchedulerState` (scheduler_state.py) and hands it to the hooks that keep state. Set `SGLANG_PLUGINS` to a
list without `dspark` to run SGLang without it.

    cpu         SGLang's DSPARK worker on CPU (each hook acts only on CPU devices/tensors)
    startup     launcher: the drafter must fit the target (the launcher never loads the target)
    planner     dspark's allocator policies in place of SGLang's DSpark verify-budget planner; without a table,
                the SPS table measured by SGLang's own forward in the schedulers before ready (sps_forward.py)
    admin       the live runtime state through /set_internal_state and /get_server_info
    rounds      each verified round's metrics (metrics.py: SGLang's /metrics) and span (tracing.py)
    flashinfer_verify  ragged target verify (eager and CUDA graphs) on the plain FlashInfer backend (GPU only)
    redaction   the API keys out of SGLang's startup log and /server_info
    request_gate  every request to a route that starts model work bounded before SGLang sees it (logprobs,
                token ids, n, max tokens, body size, sub-requests in flight); routes it cannot bound refused;
                on SIGTERM, those routes answer 503 while the requests in flight finish (drain.py)
    api_keys    401 for a request without one of `dspark serve --api-key-file`'s keys (health, metrics and liveness
                stay open)
    admin_routes  401 without SGLang's admin key on every admin route, those SGLang's own check misses included
                (the elastic-EP routes of an included router)
    capture     with `dspark serve --capture`: sampled replies written as training records, with the finished
                requests' verify counts noted for them (capture.py; its middleware is added by request_gate)
    strict_requests  OpenAI-compatible requests with an unknown field get 400 instead of running on defaults
    liveness    GET /liveness: 503 when a scheduler's loop stops for the step bound, or it has work and runs no
                forward for the liveness window; 200 while idle or busy
    draft_vocab_mask  a drafter with a draft vocabulary drafts among its tokens only, as in dspark's engine
    verify_penalties  frequency, presence and repetition penalties and min_new_tokens applied to every verify
                position as a decode step would apply them (SGLang's DSpark verify drops them)
    drafting    the drafting gate: a round skips the drafter's sampling while speculation cannot pay; a draft
                step that raises is retried once, logged and counted (draft_faults.py)
"""
from __future__ import annotations

from dspark.integration import (admin, admin_routes, api_keys, capture, cpu, draft_vocab_mask, drafting,
                                flashinfer_verify, liveness, planner, redaction, request_gate, rounds, startup,
                                strict_requests, verify_penalties)
from dspark.integration.scheduler_state import SchedulerState


def register() -> None:
    state = SchedulerState()
    cpu.install()
    startup.install()
    planner.install(state)
    admin.install(state)
    rounds.install(state)
    flashinfer_verify.install()
    redaction.install()
    request_gate.install()
    capture.install()
    admin_routes.install()
    api_keys.install()
    strict_requests.install()
    draft_vocab_mask.install()
    verify_penalties.install()
    drafting.install(state)
    liveness.install(state)
