"""A short soak of the served stack (`dspark soak` against a real `dspark serve` with DSpark): concurrency 4x the
server's max running requests, greedy answers checked against the target alone, sampled and streamed calls on
the three endpoints, prompts up to and beyond the context, client disconnects, malformed bodies and live state
changes every few seconds, over HTTP and the gRPC admin API in turns. Nothing may be lost or altered, every bad request gets a 4xx, the server survives.

It runs on the session's shared dspark_server, whose settings are set back once it is done."""
from __future__ import annotations

import json

from dspark.ops.cli import main
from tests.paths import EMBEDDED_TARGET

MAX_RUNNING = 8  # dspark_serve.py's --max-running-requests


def test_a_short_soak_loses_and_alters_nothing(dspark_server_restored, tmp_path, capsys):
    server = dspark_server_restored
    code = main(["soak", "--url", server.url, "--target", str(EMBEDDED_TARGET), "--admin-key-file",
                 str(server.admin_token), "--duration", "45", "--concurrency", str(4 * MAX_RUNNING),
                 "--max-new-tokens", "24", "--change-every", "2", "--out", str(tmp_path / "soak"),
                 "--admin-address", server.admin_address, "--admin-token-file", str(server.admin_token)])
    report = json.loads((tmp_path / "soak" / "soak.json").read_text())
    print({k: v for k, v in report.items() if k not in ("tokens_per_s", "rss_mb")})
    assert report["lost"] == 0 and not report["failed"], report["failures"]
    assert report["greedy"] > 20 and report["greedy_identical"] == report["greedy"]
    assert report["malformed"] > 0 and report["malformed_4xx"] == report["malformed"]
    assert set(report["by_kind"]) == {"greedy", "sampled", "long", "too-long", "disconnect", "malformed"}
    changes = report["state_changes"]
    for channel in ("HTTP", "gRPC"):
        assert changes.get(f"applied via {channel}", 0) >= 3 and changes.get(f"refused via {channel}", 0) >= 1
    assert set(changes) == {f"{result} via {channel}" for result in ("applied", "refused")
                            for channel in ("HTTP", "gRPC")}
    assert report["healthy_after"] and report["rss_mb"] and code == 0
    assert (tmp_path / "soak" / "soak.png").exists()
