"""A request SGLang's types refuse gets a 400 naming the field, never a file path or a traceback.

SGLang 0.5.23 answers a RequestValidationError with `str(exc)`, which holds the endpoint's source file, its line
and the client's input (a lone surrogate in /generate's body: the message named
`.../sglang/srt/entrypoints/http_server.py`, line 928). Its Anthropic and System One shapes are already clean and
stay SGLang's; every other route gets SGLang's error body with each error's location and message only.
"""
from __future__ import annotations

from dspark.integration.http_errors import error_body
from dspark.models.errors import clipped

SGLANG_OWN = ("/v1/messages", "/v1/systemone")  # shapes SGLang already scrubs
MAX_ERRORS = 5


def described(errors: list) -> tuple[str, str]:
    """(the first field at fault, a message naming each error's field and what is wrong) of pydantic's errors."""
    parts, first = [], None
    for error in errors[:MAX_ERRORS]:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        first = first or location
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return clipped(first or "body", 200), clipped("; ".join(parts), 1000) + more


def scrub_validation_errors(app) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.responses import Response

    sglang_handler = app.exception_handlers.get(RequestValidationError)

    async def scrubbed(request, exc):
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))
        if sglang_handler is not None and path.startswith(SGLANG_OWN):
            return await sglang_handler(request, exc)
        field, message = described(exc.errors())
        return Response(error_body(400, message, field), status_code=400, media_type="application/json")

    app.add_exception_handler(RequestValidationError, scrubbed)
