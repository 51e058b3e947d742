"""Who may call the admin server, over what transport, how often, and the audit trail of what they did.

Tokens: each token file holds one bearer token; the file's name is the token's name (the caller recorded in
the audit log and the state history). Admin tokens may do everything; reader tokens may GetState,
WatchState and History. A token is compared in constant time against every configured token. With mTLS, a
client certificate (verified against the client CA) identifies the caller by its subject and counts as a
reader unless a token says more. Health checking and reflection need no credential.

Transport: TLS from a certificate and key file, and mTLS when a client CA is given. Listening on anything
but loopback without TLS is refused unless explicitly allowed (`--admin-insecure`).

Updates (UpdateState, Rollback, ProfileSps) are rate-limited per caller by a token bucket, and every attempt,
accepted or refused, is one JSON line in the audit log: time, rpc, caller, peer, version before and after,
the settings diff, and the result. The log has bounds whatever callers send:

    refusals before the rate limit (unauthenticated, permission_denied, resource_exhausted) are written at most
        once per QUIET_S per (result, caller, peer kind); a written one counts in `suppressed` those of its
        key folded in since the previous line (the metrics count every attempt)
    caller, peer, detail and the diff are clipped (FIELD_CHARS) with the sha256 of the whole: a line stays
        under about 4 KB
    the file rotates by size: past max_bytes it becomes PATH.1 (PATH.1 becomes PATH.2, ...), keeping `keep`
        old files (`--admin-audit-max-bytes`, `--admin-audit-keep`)

A token's name (its file's name) is at most MAX_CALLER characters: it is the caller the schedulers record.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import grpc

from dspark.integration.addresses import is_loopback
from dspark.integration.runtime_state import MAX_CALLER
from dspark.models.errors import ConfigError, clipped, shown

ADMIN, READER = "admin", "reader"
READ_RPCS = ("GetState", "WatchState", "History")
AUDIT_MAX_BYTES, AUDIT_KEEP = 10 << 20, 5
QUIET_S = 1.0
MIN_TOKEN_CHARS = 16
FOLDED = ("unauthenticated", "permission_denied", "resource_exhausted")
FIELD_CHARS = {"caller": 256, "peer": 256, "detail": 1024, "diff": 2048}


MAX_SECRET_BYTES = 4096  # a key or token file larger than this is not one


def read_secret(path: Path, what: str) -> str:
    """A key or token file's text, stripped; refused, naming `what` and the path, when it is missing, larger than
    MAX_SECRET_BYTES, not UTF-8, or holds a control character inside (an HTTP header or gRPC metadata could not
    carry it; read with a bound: a device or a huge file is never read whole)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist")
    with path.open("rb") as handle:
        data = handle.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"{what} {path} is over {MAX_SECRET_BYTES} bytes: not a key or token file")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {err.start})") from None
    control = next((i for i, char in enumerate(text) if not char.isprintable()), None)
    if control is not None:
        raise ConfigError(f"{what} {path} holds a control character at {control} ({text[control]!r}): one line of "
                          "printable text")
    return text


@dataclass(frozen=True)
class Caller:
    name: str
    role: str  # admin | reader


@dataclass(frozen=True)
class TokenBook:
    """(name, role, token) of every configured token."""
    tokens: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def from_files(cls, admin_files=(), reader_files=()) -> "TokenBook":
        entries = []
        for role, files in ((ADMIN, admin_files), (READER, reader_files)):
            for path in map(Path, files):
                if len(path.name) > MAX_CALLER:
                    raise ConfigError(f"admin token file names must be at most {MAX_CALLER} characters (the name is "
                                      f"the caller), got {shown(path.name)}")
                token = read_secret(path, "admin token file")
                if len(token) < MIN_TOKEN_CHARS:
                    raise ConfigError(f"admin token file {path} holds a token of {len(token)} characters; "
                                      f"use at least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)")
                entries.append((path.name, role, token))
        return cls(tuple(entries))

    def identify(self, bearer: Optional[str]) -> Optional[Caller]:
        found = None
        for name, role, token in self.tokens:  # every token is compared: the time says nothing of which matched
            if bearer is not None and secrets.compare_digest(bearer.encode(), token.encode()) and found is None:
                found = Caller(name, role)
        return found


def bearer_token(metadata) -> Optional[str]:
    for key, value in metadata or ():
        if key == "authorization" and value.lower().startswith("bearer "):
            return value[len("bearer "):].strip()
    return None


def certificate_subject(context: grpc.ServicerContext) -> Optional[str]:
    auth = context.auth_context()
    names = auth.get("x509_subject") or auth.get("x509_common_name")
    return names[0].decode() if names else None


class Denied(Exception):
    """A refused call: the gRPC status code and the reason."""

    def __init__(self, code: grpc.StatusCode, reason: str, caller: str = "anonymous"):
        super().__init__(reason)
        self.code, self.reason, self.caller = code, reason, caller


def authorize(book: TokenBook, context: grpc.ServicerContext, rpc: str) -> Caller:
    """The caller of `rpc`, or Denied with UNAUTHENTICATED / PERMISSION_DENIED."""
    caller = book.identify(bearer_token(context.invocation_metadata()))
    if caller is None:
        subject = certificate_subject(context)
        if subject is None:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token (authorization: Bearer ...) or "
                                                          "client certificate is required")
        caller = Caller(subject, READER)
    if caller.role != ADMIN and rpc not in READ_RPCS:
        raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{rpc} needs an admin token; {shown(caller.name)} is a "
                                                        f"{caller.role}", caller.name)
    return caller


@dataclass(frozen=True)
class TlsFiles:
    cert: Optional[Path] = None
    key: Optional[Path] = None
    client_ca: Optional[Path] = None  # set: mTLS, client certificates required

    def server_credentials(self) -> Optional[grpc.ServerCredentials]:
        if self.cert is None and self.key is None:
            if self.client_ca is not None:
                raise ConfigError("--admin-tls-client-ca needs --admin-tls-cert and --admin-tls-key")
            return None
        if self.cert is None or self.key is None:
            raise ConfigError("TLS needs both --admin-tls-cert and --admin-tls-key")
        for path in (self.cert, self.key, self.client_ca):
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"TLS file {path} does not exist")
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials([(Path(self.key).read_bytes(), Path(self.cert).read_bytes())],
                                           root_certificates=ca, require_client_auth=ca is not None)


def check_listen_address(host: str, tls: bool, insecure: bool) -> None:
    """Refuse a plaintext admin port reachable from other machines, unless explicitly allowed."""
    if not (tls or insecure or is_loopback(host)):
        raise ConfigError(f"refusing to serve the admin API on {host} without TLS: give --admin-tls-cert and "
                          f"--admin-tls-key, listen on 127.0.0.1, or pass --admin-insecure")


@dataclass
class RateLimiter:
    """A token bucket per caller: `rate` updates a second, bursts of `burst`."""
    rate: float
    burst: int
    clock: object = time.monotonic
    buckets: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def allow(self, caller: str) -> bool:
        with self.lock:
            now = self.clock()
            level, then = self.buckets.get(caller, (float(self.burst), now))
            level = min(float(self.burst), level + (now - then) * self.rate)
            allowed = level >= 1.0
            self.buckets[caller] = (level - 1.0 if allowed else level, now)
            return allowed


class AuditLog:
    """Append-only JSON lines (one per update attempt, within the bounds of the module docstring) plus counts
    by rpc and result for the metrics."""

    def __init__(self, path: Optional[Path], max_bytes: int = AUDIT_MAX_BYTES, keep: int = AUDIT_KEEP,
                 clock=time.monotonic):
        self.path = Path(path) if path else None
        self.max_bytes, self.keep, self.clock = max_bytes, keep, clock
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}
        self.folded: dict[tuple, tuple[float, int]] = {}  # key -> (when its last line was written, folded since)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, *, rpc: str, caller: str, peer: str, result: str, before: Optional[dict] = None,
               after: Optional[dict] = None, version_before: Optional[int] = None,
               version_after: Optional[int] = None, detail: str = "") -> None:
        diff = {k: [before.get(k), after.get(k)] for k in after if before.get(k) != after.get(k)} \
            if before is not None and after is not None else {}
        line = {"time": time.time(), "rpc": rpc, "caller": bounded("caller", caller),
                "peer": bounded("peer", peer), "result": result, "version_before": version_before,
                "version_after": version_after, "diff": bounded("diff", diff), "detail": bounded("detail", detail)}
        with self.lock:
            self.counts[(rpc, result)] = self.counts.get((rpc, result), 0) + 1
            if result in FOLDED:
                key = (result, caller, peer.split(":", 1)[0])
                written, suppressed = self.folded.get(key, (None, 0))
                now = self.clock()
                if written is not None and now - written < QUIET_S:
                    self.folded[key] = (written, suppressed + 1)
                    return
                self.folded[key] = (now, 0)
                line["suppressed"] = suppressed
            if self.path is not None:
                self.append(json.dumps(line) + "\n")

    def append(self, text: str) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(text) > self.max_bytes:
            self.rotate()
        with self.path.open("a") as out:
            out.write(text)

    def rotate(self) -> None:
        """PATH -> PATH.1 -> ... -> PATH.<keep>; the oldest is dropped (keep 0: PATH itself)."""
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
            return
        for number in range(self.keep, 0, -1):
            older = self.path if number == 1 else self.numbered(number - 1)
            if older.exists():
                older.replace(self.numbered(number))

    def numbered(self, number: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{number}")


def bounded(field: str, value):
    """A line's field within FIELD_CHARS: a string clipped with the sha256 of the whole; a diff that would be
    longer as JSON becomes that JSON, clipped the same way."""
    if isinstance(value, str):
        return clipped(value, FIELD_CHARS[field], digest=True)
    text = json.dumps(value)
    return value if len(text) <= FIELD_CHARS[field] else clipped(text, FIELD_CHARS[field], digest=True)
