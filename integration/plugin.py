"""dspark's SGLang plugin, loaded by SGLang itself through the `sglang.srt.plugins` entry point.

SGLang calls `register()` early in every process it starts (launcher, scheduler, detokenizer), then
applies the hooks registered here; no SGLang source is patched or vendored. Set `SGLANG_PLUGINS` to a
list without `dspark` to run SGLang without it.

    cpu         SGLang's DSPARK worker on CPU (each hook acts only on CPU devices/tensors)
    startup     launcher: the drafter must fit the target; an SPS table is profiled when none is given
    planner     dspark's allocator policies in place of SGLang's DSpark verify-budget planner
    admin       the live runtime state through /set_internal_state and /get_server_info
    rounds      each verified round's metrics (metrics.py: SGLang's /metrics) and span (tracing.py)
    flashinfer_verify  ragged target verify (eager and CUDA graphs) on the plain FlashInfer backend (GPU only)
    redaction   the API keys out of SGLang's startup log and /server_info
    drain       on SIGTERM, new generation requests get 503 while the ones in flight finish
    strict_requests  OpenAI-compatible requests with an unknown field get 400 instead of running on defaults
    drafting    the drafting gate: a round skips the drafter's sampling while speculation cannot pay; a draft
                step that raises is retried once, logged and counted (draft_faults.py)
"""
from __future__ import annotations

from dspark.integration import (admin, cpu, drafting, drain, flashinfer_verify, planner, redaction, rounds, startup,
                                strict_requests)


def register() -> None:
    cpu.install()
    startup.install()
    planner.install()
    admin.install()
    rounds.install()
    flashinfer_verify.install()
    redaction.install()
    drain.install()
    strict_requests.install()
    drafting.install()
