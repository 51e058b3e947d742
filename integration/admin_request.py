"""SGLang's `/set_internal_state` messages, widened for dspark's runtime state (see admin.py).

`SetInternalStateWithDsparkReq`: SGLang types the body as numbers only; this one takes any JSON value
(SGLang's own keys are still checked by its handlers). `RejectedInternalStateReqOutput`: SGLang's
"not updated" reply plus the reason (and whether it was a version conflict), so the HTTP answer can say what
was wrong. `AppliedInternalStateReqOutput`: "updated" plus what an envelope-form dspark update did. A module of its own: the
messages are pickled between SGLang's processes, so the classes must be importable by name.
"""
from typing import Any, Dict, Optional

from sglang.srt.managers.io_struct import SetInternalStateReq, SetInternalStateReqOutput


class SetInternalStateWithDsparkReq(SetInternalStateReq, kw_only=True):
    server_args: Dict[str, Any]


class RejectedInternalStateReqOutput(SetInternalStateReqOutput, kw_only=True):
    reason: str
    conflict: bool = False


class AppliedInternalStateReqOutput(SetInternalStateReqOutput, kw_only=True):
    dspark: Optional[Dict[str, Any]] = None
