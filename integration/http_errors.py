"""Answering an HTTP request from an ASGI middleware with SGLang's error body, before the app sees it (the request
gate and the drain)."""
from __future__ import annotations

import json
from typing import Optional

KINDS = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 413: "PayloadTooLarge", 415: "UnsupportedMediaType",
         429: "TooManyRequests", 503: "ServiceUnavailable"}


def error_body(status: int, message: str, field: Optional[str] = None) -> bytes:
    """SGLang's error object; `param` names the field at fault."""
    return json.dumps({"object": "error", "message": message, "type": KINDS.get(status, "BadRequestError"),
                       "param": field, "code": status}).encode()


async def respond(send, status: int, body: bytes, retry_after: bool = False, close: bool = False) -> None:
    """The whole answer; `retry_after`: Retry-After 1 (a client or router may try again, elsewhere); `close`: the
    connection ends with it."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
