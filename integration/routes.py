"""SGLang's HTTP routes, each classed by what a request to it may do: the table the gate and the drain share.

Classed by the route's endpoint function, not its path: SGLang 0.5.23 lets environment variables rename some
paths (the Ollama and Vertex AI ones), and the endpoint is what runs whatever the path.

    GATED     starts model work (generation, scoring, embeddings): request_gate.py checks the body, and during
              a drain (drain.py) the route answers 503
    ADMIN     the admin key is required (the endpoint's `@auth_level(ADMIN_*)`, read through included routers):
              by SGLang, and by dspark itself (admin_routes.py), since SGLang's own check misses the admin
              endpoints of routers added with include_router; `dspark serve` always sets the key
    OPEN      starts no model work: health, model and server info, tokenization, listings; sessions
              (sessions.py bounds them)
    REFUSED   starts model work dspark does not serve or gate (audio, realtime sessions): answered 404

A route in none of these tables is REFUSED as well, so a route that a later SGLang adds stays closed until
someone classes it (tests/integration/test_request_gate.py lists the table and fails on a new route).
"""
from __future__ import annotations

from enum import Enum
from functools import lru_cache
from typing import Optional


class RouteKind(str, Enum):
    GATED = "gated"
    ADMIN = "admin"
    OPEN = "open"
    REFUSED = "refused"


GATED_ENDPOINTS = frozenset({
    "generate_request", "encode_request", "classify_request", "openai_v1_completions", "openai_v1_chat_completions",
    "openai_v1_embeddings", "openai_v1_classify", "v1_score_request", "v1_decisions_request", "v1_responses_request",
    "v1_rerank_request", "ollama_chat", "ollama_generate", "anthropic_v1_messages", "systemone_decisions",
    "sagemaker_chat_completions", "vertex_generate"})
OPEN_ENDPOINTS = frozenset({
    "openapi", "swagger_ui_html", "swagger_ui_redirect", "redoc_html", "ready", "health_generate", "get_model_info",
    "model_info", "get_server_info", "server_info", "get_hicache_l3_cache_layout", "open_session", "close_session",
    "parse_function_call_request", "separate_reasoning_request", "openai_v1_tokenize", "openai_v1_detokenize",
    "available_models", "retrieve_model", "v1_retrieve_responses", "v1_cancel_responses", "sglang_root",
    "ollama_tags", "ollama_show", "anthropic_v1_count_tokens", "sagemaker_health", "get_loads",
    "dspark_liveness"})  # the plugin's own GET /liveness (liveness.py)
OPEN_MOUNTS = frozenset({"/metrics"})  # Prometheus' app, mounted by SGLang with --enable-metrics


def endpoint_kind(endpoint) -> RouteKind:
    name = getattr(endpoint, "__name__", None)
    if name in GATED_ENDPOINTS:
        return RouteKind.GATED
    if getattr(getattr(endpoint, "_auth_level", None), "value", None) in ("admin_optional", "admin_force"):
        return RouteKind.ADMIN
    return RouteKind.OPEN if name in OPEN_ENDPOINTS else RouteKind.REFUSED


def flat_routes(routes) -> list:
    """The routes, with those of included routers (FastAPI's `include_router`) in their place."""
    out = []
    for route in routes:
        included = getattr(route, "original_router", None)
        out.extend(flat_routes(included.routes) if included is not None else [route])
    return out


def route_table(app) -> dict[str, RouteKind]:
    """{'METHODS path': kind} of every route of `app` (the tests list it)."""
    table = {}
    for route in flat_routes(app.routes):
        path = getattr(route, "path", None)
        if path is not None:
            methods = ",".join(sorted(getattr(route, "methods", None) or ())) or "WS"
            table[f"{methods} {path}"] = endpoint_kind(getattr(route, "endpoint", None))
    return table


class RouteClassifier:
    """The kind of the route a request goes to, matched against the app's own routes as Starlette matches them.
    Paths no route matches are OPEN (SGLang answers 404). Results are cached per (type, method, path) in this
    classifier's own bounded cache: clients sending random paths evict each other's entries but cannot grow it."""

    def __init__(self, app):
        self.app = app
        self._kind = lru_cache(maxsize=256)(self._match)

    def __call__(self, scope) -> RouteKind:
        return self._kind(scope["type"], scope.get("method", ""), scope["path"])[0]

    def endpoint_name(self, scope) -> Optional[str]:
        """The name of the endpoint function the request goes to (None: no route, or a mount), from the same
        cache."""
        return self._kind(scope["type"], scope.get("method", ""), scope["path"])[1]

    def _match(self, scope_type: str, method: str, path: str) -> tuple[RouteKind, Optional[str]]:
        from starlette.routing import Match

        scope = {"type": scope_type, "method": method, "path": path, "root_path": ""}
        for route in flat_routes(self.app.routes):
            try:
                match, child = route.matches(scope)
            except Exception:  # a route type that cannot match this scope
                continue
            if match == Match.FULL:
                if getattr(route, "path", None) in OPEN_MOUNTS:
                    return RouteKind.OPEN, None
                endpoint = child.get("endpoint") or getattr(route, "endpoint", None)
                return endpoint_kind(endpoint), getattr(endpoint, "__name__", None)
        return RouteKind.OPEN, None
