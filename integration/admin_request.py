"""SGLang's `SetInternalStateReq`, widened to carry dspark's runtime-state object (see admin.py).

SGLang types the body as numbers only; this subclass takes any JSON value (SGLang's own keys are still
checked by its handlers). A module of its own: the request is pickled between SGLang's processes, so the
class must be importable by name, and importing it loads SGLang's io_struct, which only the hook needs.
"""
from typing import Any, Dict

from sglang.srt.managers.io_struct import SetInternalStateReq


class SetInternalStateWithDsparkReq(SetInternalStateReq, kw_only=True):
    server_args: Dict[str, Any]
