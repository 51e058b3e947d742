"""SGLang's admin routes answer only with its admin key, whether or not SGLang's own check reaches them.

SGLang 0.5.23 marks its admin endpoints `@auth_level(ADMIN_OPTIONAL)`, and its middleware finds a request's level by
matching it against `app.router.routes`. A router added with `include_router` is one entry there (FastAPI 0.165
keeps the router whole), which SGLang's lookup never opens, so the admin endpoints of included routers resolve as
ordinary ones and answer anyone: `/scale_elastic_ep` (rescales an elastic-EP deployment) and
`/is_scaling_elastic_ep` (sglang/srt/entrypoints/elastic_ep.py) in 0.5.23.

So dspark checks every route routes.py classes ADMIN (by the endpoint's own marking, included routers opened)
itself, with SGLang's own decision (`decide_request_auth` at the ADMIN_OPTIONAL level, SGLang's keys): under
`dspark serve`, which always sets the admin key, a request without `Authorization: Bearer <admin key>` gets 401
before SGLang sees it. tests/integration/test_routes.py lists the routes SGLang's lookup misses from its route table
and sends each of them without the key, so a route a later SGLang adds this way is covered and shown.

Installed in SGLang's launcher only (the process that serves HTTP), as launch_server starts.
"""
from __future__ import annotations

import multiprocessing

from dspark.integration.http_errors import error_body, respond
from dspark.integration.metrics import observe_gate_refusal
from dspark.integration.routes import RouteClassifier, RouteKind

REFUSAL = error_body(401, "this route needs SGLang's admin key: send `Authorization: Bearer <admin key>`",
                     "authorization")


def admin_key_sent(scope, force: bool = False) -> bool:
    """Whether SGLang's own rule for an ADMIN_OPTIONAL endpoint (`force`: ADMIN_FORCE, which needs the admin key
    even where none is set) admits the request, with the server's keys."""
    from sglang.srt.runtime_context import get_serving
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    values = [value for name, value in scope.get("headers") or [] if name.lower() == b"authorization"]
    serving = get_serving()
    return decide_request_auth(method=scope["method"], path=scope["path"],
                               authorization_header=values[0].decode("latin-1") if len(values) == 1 else None,
                               api_key=serving.api_key, admin_api_key=serving.admin_api_key,
                               auth_level=AuthLevel.ADMIN_FORCE if force else AuthLevel.ADMIN_OPTIONAL).allowed


class RequireAdminKey:
    """ASGI middleware: 401 for a request to an ADMIN route without the admin key."""

    def __init__(self, app, classify: RouteClassifier):
        self.app, self.classify = app, classify

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.classify(scope) is RouteKind.ADMIN and not admin_key_sent(scope):
            observe_gate_refusal(401, "authorization")
            return await respond(send, 401, REFUSAL)
        await self.app(scope, receive, send)


def _add_middleware(*args, **kwargs) -> None:
    from sglang.srt.entrypoints.http_server import app

    app.add_middleware(RequireAdminKey, classify=RouteClassifier(app))


def install() -> None:
    if multiprocessing.parent_process() is not None:  # a scheduler or detokenizer: no HTTP app here
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.entrypoints.http_server.launch_server", _add_middleware, HookType.BEFORE)
