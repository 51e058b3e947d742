"""OpenAI-compatible requests with an unknown field are refused (400 naming it), as OpenAI's own API refuses them.

SGLang 0.5.23's `CompletionRequest` and `ChatCompletionRequest` silently drop fields they do not know, so a
misspelt `max_token` or `temprature` runs with the defaults and the client never learns why. The plugin swaps
in subclasses that forbid extra fields (isinstance checks still hold); the routes, defined when SGLang's HTTP
app is imported after the hooks apply, validate against them.
"""
from __future__ import annotations

MODELS = ("CompletionRequest", "ChatCompletionRequest")
PROTOCOL = "sglang.srt.entrypoints.openai.protocol"


def forbidding_extra(model: type) -> type:
    from pydantic import ConfigDict

    return type(model.__name__, (model,), {"model_config": ConfigDict(**{**model.model_config, "extra": "forbid"}),
                                           "__module__": model.__module__, "__doc__": model.__doc__})


def install() -> None:
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    protocol = importlib.import_module(PROTOCOL)
    for name in MODELS:
        HookRegistry.register(f"{PROTOCOL}.{name}", forbidding_extra(getattr(protocol, name)), HookType.REPLACE)
