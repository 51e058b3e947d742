"""dspark's SGLang plugin, loaded by SGLang itself through the `sglang.srt.plugins` entry point.

SGLang calls `register()` early in every process it starts (launcher, scheduler, detokenizer), then
applies the hooks registered here; no SGLang source is patched or vendored. Set `SGLANG_PLUGINS` to a
list without `dspark` to run SGLang without it.
"""
from __future__ import annotations

from dspark.integration import cpu


def register() -> None:
    cpu.install()
