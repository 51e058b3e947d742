"""API keys on the OpenAI-compatible API: a request without one of the configured keys gets 401.

SGLang's own `--api-key` takes one key, on the command line (`ps`, the pod spec, Git). `dspark serve --api-key-file`
(repeatable) reads each key from its own file instead and hands them to SGLang's launcher in a private file
(mode 0600, in `dspark serve`'s secrets folder) named by API_KEYS_ENV; several keys let one rotate while the
other still works. A request passes with `Authorization: Bearer <key>` for any configured key, compared in
constant time with every key (hmac.compare_digest, never stopping at the first match).

SGLang itself gets a key of its own, random per start and known only to the process tree (`dspark serve` puts it
in SGLang's private config file): SGLang's server warmup sends it, and SGLang's api-key middleware, which would
otherwise know none of the configured keys, requires it. This middleware runs outside SGLang's: it checks the
client's key, then hands the request on carrying SGLang's key. Installed right after SGLang installs its own
(an AROUND hook on add_api_key_middleware, which SGLang calls whenever it has a key), so a launch without SGLang's
key fails closed: SGLang's middleware then refuses every client key.

What stays open, as with SGLang's own api-key (sglang/srt/utils/auth.py): OPTIONS, /health*, /ready* and
/metrics* (probes and scrapers carry no secret), and dspark's /liveness (the liveness probe). Routes SGLang marks as
admin routes are left to SGLang's admin key (`dspark serve` always sets one), which its own middleware checks; the
admin key also opens the other routes (the admin sidecar reads /server_info with it).

Installed in SGLang's launcher only (the process that serves HTTP); it wraps the request gate and the drain, so a
request without a key is refused before the gate reads its body or counts it in flight. On /metrics:
dspark_api_key_refused_requests_total{reason} (missing: no bearer token; wrong: none of the keys).
"""
from __future__ import annotations

import hmac
import multiprocessing
import os
from functools import lru_cache
from pathlib import Path

from dspark.integration.http_errors import error_body, respond
from dspark.integration.metrics import metrics_on
from dspark.models.errors import ConfigError

API_KEYS_ENV = "DSPARK_API_KEYS_FILE"
MIN_KEY_CHARS = 16
MAX_KEYS = 16
MAX_KEYS_FILE_BYTES = 64 << 10
OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/liveness")
REFUSAL = error_body(401, "this API needs an API key: send `Authorization: Bearer <key>`", "authorization")


def check_key(key: str, source: str) -> str:
    """A key as given (stripped text of one line); refused, naming `source`, when too short or unprintable."""
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(f"{source} holds an API key of {len(key)} characters; use at least {MIN_KEY_CHARS} "
                          "(e.g. `openssl rand -hex 32`)")
    if not key.isprintable() or " " in key:
        raise ConfigError(f"{source} holds an API key with a space or a control character: one word of printable "
                          "text (an Authorization header carries it)")
    return key


def check_keys(keys: list[str], source: str) -> list[str]:
    if not 1 <= len(keys) <= MAX_KEYS:
        raise ConfigError(f"{source} must hold 1..{MAX_KEYS} API keys, got {len(keys)}")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{source} holds the same API key twice")
    return [check_key(key, source) for key in keys]


def write_keys(path: Path, keys: list[str]) -> None:
    """The hand-over file: one key per line, readable by this user only (created so before a key is in it)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(key + "\n" for key in keys))


def read_keys(path: str) -> list[bytes]:
    """The keys of the hand-over file (bounded read), checked as `dspark serve` checked them."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_KEYS_FILE_BYTES + 1)
    if len(data) > MAX_KEYS_FILE_BYTES:
        raise ConfigError(f"{API_KEYS_ENV} {path} is over {MAX_KEYS_FILE_BYTES} bytes")
    try:
        keys = data.decode("utf-8").split()
    except UnicodeDecodeError as err:
        raise ConfigError(f"{API_KEYS_ENV} {path} is not UTF-8 text (byte {err.start})") from None
    return [key.encode() for key in check_keys(keys, f"{API_KEYS_ENV} {path}")]


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the request's one `Authorization: Bearer <token>` header; None when there is none."""
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if len(values) != 1:
        return None
    scheme, _, token = values[0].partition(b" ")
    return token.strip() or None if scheme.lower() == b"bearer" else None


def matches(token: bytes, keys: list[bytes]) -> bool:
    """Whether `token` is one of `keys`, compared with every key in constant time."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found


def open_route(scope: dict) -> bool:
    """Probes, scrapers and CORS preflights: they pass without a key (SGLang's key is added for /liveness, which
    SGLang's own middleware does not know as a probe)."""
    return scope["method"] == "OPTIONS" or scope["path"].startswith(OPEN_PREFIXES)


def admin_route(scope: dict, app) -> bool:
    """A route SGLang guards with its admin key: the request goes on as it came."""
    from sglang.srt.utils.auth import AuthLevel, _get_auth_level_from_app_and_scope

    return _get_auth_level_from_app_and_scope(app, scope) is not AuthLevel.NORMAL


@lru_cache(maxsize=1)
def refusals():
    """The refusal counter, created once in SGLang's HTTP process (after SGLang set up multiprocess metrics)."""
    from prometheus_client import Counter

    return Counter("dspark_api_key_refused_requests", "requests refused 401 for a missing or wrong API key",
                   ["reason"])


class RequireApiKey:
    """ASGI middleware: 401 unless the request carries one of `keys` or SGLang's own key (exempt ones aside); a
    request that passes goes on carrying SGLang's key, which SGLang's own middleware inside this one requires."""

    def __init__(self, app, keys: list[bytes], sglang_key: bytes, fastapi_app):
        self.app, self.keys, self.fastapi_app = app, keys, fastapi_app
        self.sglang_key, self.sglang_header = sglang_key, b"Bearer " + sglang_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or admin_route(scope, self.fastapi_app):
            return await self.app(scope, receive, send)
        token = bearer_token(scope["headers"])
        if open_route(scope) or (token is not None and matches(token, self.keys + [self.sglang_key])):
            headers = [(name, value) for name, value in scope["headers"] if name.lower() != b"authorization"]
            return await self.app({**scope, "headers": [*headers, (b"authorization", self.sglang_header)]},
                                  receive, send)
        if metrics_on():
            refusals().labels(reason="missing" if token is None else "wrong").inc()
        await respond(send, 401, REFUSAL)


def install() -> None:
    path = os.environ.get(API_KEYS_ENV)
    if multiprocessing.parent_process() is not None or not path:  # a scheduler, or no keys: nothing to check
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    keys = read_keys(path)  # a bad hand-over stops the launch here

    def add_outside_sglangs(add_api_key_middleware, app, *args, api_key=None, admin_api_key=None, **kwargs) -> None:
        add_api_key_middleware(app, *args, api_key=api_key, admin_api_key=admin_api_key, **kwargs)
        if not api_key:
            raise ConfigError(f"{API_KEYS_ENV} is set but SGLang has no api key of its own: start it with "
                              "`dspark serve --api-key-file`, which sets both")
        # the admin key opens the API too: the admin sidecar reads /server_info with it
        admin = [admin_api_key.encode()] if admin_api_key else []
        app.add_middleware(RequireApiKey, keys=keys + admin, sglang_key=api_key.encode(), fastapi_app=app)

    HookRegistry.register("sglang.srt.utils.auth.add_api_key_middleware", add_outside_sglangs, HookType.AROUND)
