"""SGLang's sessions (/open_session, /close_session) bounded in number, id length and lifetime, and closed only by
whoever opened them or the admin.

SGLang 0.5.23 opens any number of sessions, with client-chosen ids of any length, that live until someone closes
them (or, with the client's own `timeout`, until idle that long), and closes a session for anyone who names it. The
guard answers in SGLang's HTTP process, in front of both routes (after the request gate has capped the body at
max_utility_body_bytes):

    /open_session   400 when `session_id` is not a string of at most max_session_id_chars characters (an id left
                    out is SGLang's own: 32 hex digits); 429 with Retry-After when max_sessions are open. Else
                    SGLang opens it, and its answer carries `X-Session-Key`: a random key, the only thing besides
                    the admin key that closes the session
    /close_session  403 unless the request carries the session's `X-Session-Key`, or SGLang's admin key
                    (`Authorization: Bearer <admin key>`, which `dspark serve` always sets); an id no one opened
                    here gets the same 403, so the answer tells nothing about other clients' ids
    lifetime        each session is closed max_session_lifetime_s after it opened, by the guard itself (through
                    SGLang's tokenizer manager, as /close_session does), whatever its `timeout`

The limits are request_limits.py's (max_sessions, max_session_id_chars, max_session_lifetime_s). What the guard
holds per session is its id, a digest of its key and when it ends: at most max_sessions entries, the keys never
kept in clear.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Optional

from dspark.integration.admin_routes import admin_key_sent
from dspark.integration.http_errors import error_body, respond
from dspark.integration.metrics import observe_gate_refusal
from dspark.integration.request_limits import RequestLimits
from dspark.integration.routes import RouteClassifier
from dspark.models.errors import shown

KEY_HEADER = b"x-session-key"


@dataclass(frozen=True)
class OpenSession:
    key_digest: bytes
    ends: float  # time.monotonic()


class Refused(Exception):
    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def field_of(body: bytes, name: str):
    """`name` of a JSON object body (None: absent, or the body is not an object: SGLang answers that itself)."""
    try:
        payload = json.loads(body) if body.strip() else None
    except ValueError:
        return None
    return payload.get(name) if isinstance(payload, dict) else None


async def read_all(receive) -> bytes:
    """The body, which the request gate already read whole, capped, and hands on in one message."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes):
    sent = []

    async def receive():
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}
    return receive


async def close_in_sglang(session_id: str) -> None:
    from sglang.srt.entrypoints.http_server import _global_state
    from sglang.srt.managers.io_struct import CloseSessionReqInput

    await _global_state.tokenizer_manager.close_session(CloseSessionReqInput(session_id=session_id))


class SessionGuard:
    """ASGI middleware in front of SGLang's two session routes (module docstring)."""

    def __init__(self, app, classify: RouteClassifier, limits: RequestLimits, clock=time.monotonic):
        self.app, self.classify, self.limits, self.clock = app, classify, limits, clock
        self.sessions: dict[str, OpenSession] = {}
        self.opening = 0  # opens admitted and not yet answered: they count against max_sessions too
        self.expiry: Optional[asyncio.Task] = None

    async def __call__(self, scope, receive, send):
        endpoint = self.classify.endpoint_name(scope) if scope["type"] == "http" else None
        if endpoint not in ("open_session", "close_session"):
            return await self.app(scope, receive, send)
        body = await read_all(receive)
        await self.close_expired()
        try:
            if endpoint == "open_session":
                return await self.open(scope, body, send)
            await self.close(scope, body, send)
        except Refused as refused:
            observe_gate_refusal(refused.status, refused.field)
            await respond(send, refused.status, error_body(refused.status, refused.message, refused.field),
                          retry_after=refused.status == 429)

    async def open(self, scope, body: bytes, send) -> None:
        session_id = field_of(body, "session_id")
        bound = self.limits.max_session_id_chars
        if session_id is not None and not (isinstance(session_id, str) and len(session_id) <= bound):
            length = f"{len(session_id)} characters" if isinstance(session_id, str) else shown(session_id)
            raise Refused(400, "session_id", f"session_id must be a string of at most {bound} characters "
                                             f"(max_session_id_chars), got {length}")
        if len(self.sessions) + self.opening >= self.limits.max_sessions:
            raise Refused(429, "max_sessions", f"{self.limits.max_sessions} sessions are open on this replica "
                                               f"(max_sessions): close one, or retry once one ends")
        key = secrets.token_urlsafe(32).encode()
        answer = {"status": None, "body": b""}

        async def send_with_key(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                if message["status"] == 200:
                    message = {**message, "headers": [*message.get("headers", []), (KEY_HEADER, key)]}
            elif message["type"] == "http.response.body":
                answer["body"] += message.get("body", b"")
                if answer["status"] == 200 and not message.get("more_body", False):
                    self.opened(answer["body"], key)
            await send(message)

        self.opening += 1
        try:
            await self.app(scope, replay(body), send_with_key)
        finally:
            self.opening -= 1

    def opened(self, answer: bytes, key: bytes) -> None:
        try:
            session_id = json.loads(answer)
        except ValueError:
            return
        if isinstance(session_id, str):
            self.sessions[session_id] = OpenSession(digest(key), self.clock() + self.limits.max_session_lifetime_s)
            if self.expiry is None or self.expiry.done():
                self.expiry = asyncio.get_running_loop().create_task(self.expire())

    async def close(self, scope, body: bytes, send) -> None:
        session_id = field_of(body, "session_id")
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        keys = [value for name, value in scope.get("headers") or [] if name.lower() == KEY_HEADER]
        owner = session is not None and len(keys) == 1 and hmac.compare_digest(digest(keys[0]), session.key_digest)
        if not (owner or admin_key_sent(scope, force=True)):
            raise Refused(403, "session_id", "a session is closed by whoever opened it (its X-Session-Key header, "
                                             "from /open_session's answer) or with the admin key")
        if isinstance(session_id, str):
            self.sessions.pop(session_id, None)
        await self.app(scope, replay(body), send)

    async def close_expired(self) -> None:
        now = self.clock()
        for session_id in [s for s, session in self.sessions.items() if session.ends <= now]:
            del self.sessions[session_id]
            await close_in_sglang(session_id)

    async def expire(self) -> None:
        """Close each session when its lifetime ends, until none is open."""
        while self.sessions:
            await asyncio.sleep(max(0.0, min(s.ends for s in self.sessions.values()) - self.clock()))
            await self.close_expired()
