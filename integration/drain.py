"""Graceful drain: on SIGTERM, refuse new generation requests and let the ones in flight finish.

SGLang 0.5.23 already drains on SIGTERM: the tokenizer manager sets `gracefully_exit`, `/health` and
`/health_generate` answer 503 (so Kubernetes takes the pod out of its Services), and once no request is left
(`rid_to_state` empty, checked every 5 s) it shuts the schedulers down and exits 0. But it keeps accepting new
generation requests meanwhile, each of which prolongs the drain and may be cut off by the grace period's
SIGKILL. This middleware answers them 503 at once, with `Retry-After`, before any response starts (a refusal
inside a stream would arrive after its 200), so a client or router retries on another replica. Admin,
health and metrics paths stay open.

Installed in SGLang's launcher only (the process that serves HTTP; its children never import the app), as
launch_server starts: importing the app any earlier, before SGLang applied every plugin's hooks, would bind
its routes to the request classes other hooks replace (admin_request.py).
"""
from __future__ import annotations

import multiprocessing

GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings")
REFUSAL = b'{"object": "error", "message": "the server is draining (SIGTERM): retry on another replica", ' \
          b'"type": "ServiceUnavailable", "code": 503}'


def draining() -> bool:
    from sglang.srt.entrypoints.http_server import _global_state

    manager = getattr(_global_state, "tokenizer_manager", None) if _global_state is not None else None
    return manager is not None and manager.gracefully_exit


class RefuseWhileDraining:
    """ASGI middleware: 503 for generation requests once the server drains."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] in GENERATION_PATHS and draining():
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": REFUSAL})
            return
        await self.app(scope, receive, send)


def _add_middleware(*args, **kwargs) -> None:
    from sglang.srt.entrypoints.http_server import app

    app.add_middleware(RefuseWhileDraining)


def install() -> None:
    if multiprocessing.parent_process() is not None:  # a scheduler or detokenizer: no HTTP app here
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.entrypoints.http_server.launch_server", _add_middleware, HookType.BEFORE)
