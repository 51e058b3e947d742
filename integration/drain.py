"""Graceful drain: on SIGTERM, refuse new requests for model work and let the ones in flight finish.

SGLang 0.5.23 already drains on SIGTERM: the tokenizer manager sets `gracefully_exit`, `/health` and
`/health_generate` answer 503 (so Kubernetes takes the pod out of its Services), and once no request is left
(`rid_to_state` empty, checked every 5 s) it shuts the schedulers down and exits 0. But it keeps accepting new
generation requests meanwhile, each of which prolongs the drain and may be cut off by the grace period's
SIGKILL. This middleware answers them 503 at once, with `Retry-After`, before any response starts (a refusal
inside a stream would arrive after its 200), so a client or router retries on another replica. Which routes
start model work is the route table the request gate uses (routes.py: GATED), so every one of them drains;
admin, health and metrics routes stay open.

request_gate.py installs it, outermost, in SGLang's launcher.
"""
from __future__ import annotations

from dspark.integration.http_errors import error_body, respond
from dspark.integration.routes import RouteClassifier, RouteKind

REFUSAL = error_body(503, "the server is draining (SIGTERM): retry on another replica")


def draining() -> bool:
    from sglang.srt.entrypoints.http_server import _global_state

    manager = getattr(_global_state, "tokenizer_manager", None) if _global_state is not None else None
    return manager is not None and manager.gracefully_exit


class RefuseWhileDraining:
    """ASGI middleware: 503 for requests to GATED routes once the server drains."""

    def __init__(self, app, classify: RouteClassifier):
        self.app, self.classify = app, classify

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and draining() and self.classify(scope) is RouteKind.GATED:
            return await respond(send, 503, REFUSAL, retry_after=True, close=True)
        await self.app(scope, receive, send)
