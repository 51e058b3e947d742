"""Secrets kept out of SGLang's startup log and `/server_info`.

SGLang 0.5.23 redacts only its watermark keys there: the launcher logs `server_args={...}` and `/server_info`
(`build_server_info`, open to anyone who reaches the HTTP port) returns the server arguments whole, and a
`launch_command` rebuilt from the config file with `--admin-api-key KEY`. `dspark serve` hands SGLang its admin
key in a private config file; without this, anyone who can read the pod's logs or call `/server_info` could take
it and change the live state.

Which names are secret: those whose last word (split on `_`, or `-` in a flag, any case) is one of
SECRET_WORDS: `api_key`, `admin_api_key`, `ssl_keyfile_password`, `watermark_key`, `hf_token`,
`client_secret`. The last word decides because the secret words also begin names that hold no secret:
`tokenizer_path`, `skip_tokenizer_init`, `max_total_tokens`, `speculative_token_map` and `ssl_keyfile` (a
path, not the key) stay readable. Every such field that is set, and the value of every such flag in
launch_command (`--flag value`, `--flag=value`, quoted or not), becomes REDACTED.
"""
from __future__ import annotations

import re

SECRET_WORDS = ("password", "passwd", "secret", "token", "key", "apikey", "credential", "credentials")
REDACTED = "<redacted>"
SECRET_FLAG = re.compile(rf"(--(?:[\w]+-)*(?:{'|'.join(SECRET_WORDS)})[ =])('[^']*'|\"[^\"]*\"|\S+)",
                         re.IGNORECASE)


def is_secret(name: str) -> bool:
    return name.lower().replace("-", "_").rsplit("_", 1)[-1] in SECRET_WORDS


def redacted(result: dict, *args, **kwargs) -> dict:
    """The server-args dict with every secret field that is set, and the secret flags' values in its
    launch_command, replaced by REDACTED."""
    clean = {**result, **{name: REDACTED for name, value in result.items() if is_secret(name) and value is not None}}
    if isinstance(clean.get("launch_command"), str):
        clean["launch_command"] = SECRET_FLAG.sub(rf"\g<1>{REDACTED}", clean["launch_command"])
    return clean


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.entrypoints.engine._server_args_for_logging", redacted, HookType.AFTER)
    HookRegistry.register("sglang.srt.utils.common.build_server_info", redacted, HookType.AFTER)
    HookRegistry.register("sglang.srt.runtime_context.RuntimeContext.resolved_server_args_dict", redacted,
                          HookType.AFTER)
