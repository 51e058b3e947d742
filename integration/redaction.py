"""Secrets kept out of SGLang's startup log and `/server_info`.

SGLang 0.5.23 redacts only its watermark keys there: the launcher logs `server_args={...}` and `/server_info`
(`build_server_info`, open to anyone who reaches the HTTP port) returns the server arguments whole, `api_key`
and `admin_api_key` included, and a `launch_command` rebuilt from the config file with `--admin-api-key KEY`. `dspark serve` hands SGLang its admin key in a private config file; without this,
anyone who can read the pod's logs or call `/server_info` could take it and change the live state.
"""
from __future__ import annotations

import re

SECRET_FIELDS = ("api_key", "admin_api_key")
REDACTED = "<redacted>"
SECRET_FLAG = re.compile(r"(--(?:admin-)?api-key[ =])(\S+)")


def redacted(result: dict, *args, **kwargs) -> dict:
    """The server-args dict with every secret field that is set, and the secret flags' values in its
    launch_command, replaced by REDACTED."""
    clean = {**result, **{name: REDACTED for name in SECRET_FIELDS if result.get(name) is not None}}
    if isinstance(clean.get("launch_command"), str):
        clean["launch_command"] = SECRET_FLAG.sub(rf"\g<1>{REDACTED}", clean["launch_command"])
    return clean


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.entrypoints.engine._server_args_for_logging", redacted, HookType.AFTER)
    HookRegistry.register("sglang.srt.utils.common.build_server_info", redacted, HookType.AFTER)
    HookRegistry.register("sglang.srt.runtime_context.RuntimeContext.resolved_server_args_dict", redacted,
                          HookType.AFTER)
