"""Sessions bounded in number, id length and lifetime, and closed only by whoever opened them or the admin (issue 61,
finding 5: 2,000 sessions with 1 KB ids, 20 MB ids, sessions that never expire, and anyone closing anyone's session),
on a real `dspark serve` with small session limits: the session's gate_limits_server (tests/integration/conftest.py;
these tests fill its sessions: nothing else there opens one)."""
from __future__ import annotations

import json
import time
from email.message import Message
import urllib.error
import urllib.request

import pytest

from tests.integration.dspark_serve import MAX_SESSION_ID_CHARS as MAX_ID_CHARS, MAX_SESSIONS
from tests.integration.dspark_serve import SESSION_LIFETIME_S as LIFETIME_S


@pytest.fixture(scope="module")
def server(gate_limits_server):
    return gate_limits_server


def post(url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Message, bytes]:
    """The status, headers (names in any case) and body of the answer."""
    request = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json",
                                                                     **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def open_session(url: str, session_id: str | None = None) -> tuple[int, Message, bytes]:
    return post(url, "/open_session", json.dumps({"capacity_of_str_len": 1000, **(
        {"session_id": session_id} if session_id is not None else {})}).encode())


def close_session(url: str, session_id: str, headers: dict[str, str] | None = None) -> int:
    return post(url, "/close_session", json.dumps({"session_id": session_id}).encode(), headers)[0]


def refusal(answer: tuple[int, Message, bytes]) -> tuple[int, str, str]:
    status, _, body = answer
    error = json.loads(body)
    return status, error["param"], error["message"]


def test_a_session_is_closed_only_by_its_opener_or_the_admin(server):
    status, headers, body = open_session(server.url, "chat-of-alice")
    assert status == 200 and json.loads(body) == "chat-of-alice"
    alice = {"X-Session-Key": headers["X-Session-Key"]}
    _, headers, body = open_session(server.url)  # SGLang chooses the id
    bob_session, bob = json.loads(body), {"X-Session-Key": headers["X-Session-Key"]}
    admin = {"Authorization": f"Bearer {server.admin_token.read_text().strip()}"}

    assert close_session(server.url, "chat-of-alice") == 403  # anyone
    assert close_session(server.url, "chat-of-alice", bob) == 403  # another session's owner
    assert close_session(server.url, "chat-of-alice", {"Authorization": "Bearer not-the-admin-key"}) == 403
    assert close_session(server.url, "no-such-session", bob) == 403  # the same answer: no oracle for ids
    assert open_session(server.url, "chat-of-alice")[0] == 400, "still open: SGLang refuses the same id twice"
    assert close_session(server.url, "chat-of-alice", alice) == 200
    assert close_session(server.url, bob_session, admin) == 200
    # both closed in SGLang: their ids open again
    for session_id in ("chat-of-alice", bob_session):
        status, headers, _ = open_session(server.url, session_id)
        assert status == 200
        assert close_session(server.url, session_id, {"X-Session-Key": headers["X-Session-Key"]}) == 200


def test_session_ids_are_bounded_in_length(server):
    status, field, message = refusal(open_session(server.url, "x" * (MAX_ID_CHARS + 1)))
    assert (status, field) == (400, "session_id")
    assert message == (f"session_id must be a string of at most {MAX_ID_CHARS} characters (max_session_id_chars), "
                       f"got {MAX_ID_CHARS + 1} characters")
    assert refusal(open_session(server.url, ["a", "list"]))[:2] == (400, "session_id")
    assert open_session(server.url, "x" * (20 << 20))[0] == 413  # a 20 MB id: refused before it is read


def test_sessions_are_bounded_in_number_and_each_is_closed_when_its_lifetime_ends(server):
    opened = [f"session-{n}" for n in range(MAX_SESSIONS)]
    for session_id in opened:
        assert open_session(server.url, session_id)[0] == 200
    first_ends = time.monotonic() + LIFETIME_S
    status, headers, body = open_session(server.url, "one-too-many")
    assert refusal((status, headers, body)) == (429, "max_sessions", f"{MAX_SESSIONS} sessions are open on this "
                                                "replica (max_sessions): close one, or retry once one ends")
    assert headers["Retry-After"] == "1"
    # No client closes them: each is closed when its lifetime ends, in SGLang too (its id opens again)
    while open_session(server.url, opened[0])[0] != 200:
        assert time.monotonic() < first_ends + 300, "the sessions outlived their lifetime"
        time.sleep(1.0)
    for session_id in opened[1:]:
        status, headers, _ = open_session(server.url, session_id)
        assert status == 200
        assert close_session(server.url, session_id, {"X-Session-Key": headers["X-Session-Key"]}) == 200
