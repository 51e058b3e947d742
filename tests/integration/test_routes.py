"""Every admin route needs SGLang's admin key, including those SGLang's own check never reaches (issue 61,
finding 5): the list is read from SGLang 0.5.23's route table, matched as SGLang's auth middleware matches it, and
each route on it is sent without the key to a real `dspark serve`."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

# In a clean process: SGLang's HTTP module sets up state on import. Each route of the table, the class dspark gives
# it, and the auth level SGLang's own middleware resolves for a request to it.
SCRIPT = """
import json
from sglang.srt.entrypoints.http_server import app
from sglang.srt.utils.auth import _get_auth_level_from_app_and_scope
from dspark.integration.routes import endpoint_kind, flat_routes
rows = []
for route in flat_routes(app.routes):
    for method in sorted(getattr(route, "methods", None) or ()):
        scope = {"type": "http", "method": method, "path": route.path, "root_path": "", "headers": []}
        marked = getattr(getattr(route.endpoint, "_auth_level", None), "value", "normal")
        rows.append([method, route.path, endpoint_kind(route.endpoint).value, marked,
                     _get_auth_level_from_app_and_scope(app, scope).value])
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def sglang_routes(tmp_path_factory) -> list[list[str]]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         cwd=tmp_path_factory.mktemp("routes"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def unchecked_by_sglang(rows: list[list[str]]) -> list[tuple[str, str]]:
    """(method, path) of the routes whose endpoint SGLang marks admin-only but whose requests its middleware
    resolves as ordinary ones (no key asked)."""
    return [(method, path) for method, path, _, marked, resolved in rows if marked != "normal" and resolved == "normal"]


def test_the_admin_routes_sglang_does_not_check_are_found_in_its_table_and_classed_admin(sglang_routes):
    unchecked = unchecked_by_sglang(sglang_routes)
    # SGLang 0.5.23's: the elastic-EP router, added with include_router. A later SGLang may add to it; each is
    # covered by dspark's check as long as it is classed admin (below), and the live test sends it.
    assert unchecked == [("POST", "/scale_elastic_ep"), ("GET", "/is_scaling_elastic_ep")]
    kinds = {(method, path): kind for method, path, kind, _, _ in sglang_routes}
    assert all(kinds[route] == "admin" for route in unchecked)
    marked_open = [(m, p, k) for m, p, k, marked, _ in sglang_routes if marked != "normal" and k != "admin"]
    assert marked_open == [], "an endpoint SGLang marks admin-only must never be classed otherwise"


def send(url: str, method: str, path: str, key: str | None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + path, method=method, headers=headers,
                                     data=json.dumps({"new_ep_size": 2}).encode() if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_each_admin_route_sglang_does_not_check_answers_401_without_the_admin_key(sglang_routes, dspark_server):
    key = dspark_server.admin_token.read_text().strip()  # `dspark serve`'s admin key: the first admin token
    for method, path in unchecked_by_sglang(sglang_routes):
        for sent in (None, "not-the-admin-key-of-this-replica"):
            status, body = send(dspark_server.url, method, path, sent)
            assert status == 401 and json.loads(body)["param"] == "authorization", (method, path, sent, body)
        # With the key the request reaches SGLang, which has no elastic-EP backend here
        assert send(dspark_server.url, method, path, key) == (404, b'{"error":"elastic EP is not enabled (set '
                                                                  b'--elastic-ep-backend)"}'), (method, path)
    assert send(dspark_server.url, "POST", "/flush_cache", None)[0] == 401  # an admin route SGLang checks itself
