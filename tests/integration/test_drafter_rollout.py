"""A drafter rolled out to a fleet of two real replicas with a canary (`dspark admin load-drafter`,
ops/admin/drafter_rollout.py): the session's gate_limits_server is the canary and dspark_server the rest of the
fleet, both under the same greedy traffic the whole time, every answer the target's own.

A deliberately worse drafter (its weights drowned in noise: no draft survives) is rolled back from the canary by
itself; a good drafter offered while the fleet serves the worse one beats it and is promoted to every replica. Each
replica serves its own drafter again at the end."""
from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

from dspark.models.target_io import target_fingerprint
from dspark.ops.cli import main

from tests.perturbed_drafter import perturbed_copy

pytestmark = pytest.mark.slow

PROMPTS = ["def parse(text):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):", "for line in f:"]
MAX_NEW_TOKENS = 24
WINDOW = ["--canary", "1", "--canary-wait", "4", "--canary-margin", "0.1", "--canary-windows", "3"]


def greedy(url: str, prompt: str) -> list[int]:
    body = json.dumps({"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}})
    request = urllib.request.Request(url + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["output_ids"]


class Traffic:
    """Greedy requests to each replica back to back (a client each) until stopped, every answer checked against the
    first one, so that every window of the rollout sees traffic on both sides."""

    def __init__(self, replicas):
        self.stop, self.answers, self.wrong = threading.Event(), 0, []
        self.reference = {prompt: greedy(replicas[0].url, prompt) for prompt in PROMPTS}
        self.threads = [threading.Thread(target=self.run, args=(replica,), daemon=True) for replica in replicas]

    def run(self, replica) -> None:
        sent = 0
        while not self.stop.is_set():
            prompt = PROMPTS[sent % len(PROMPTS)]
            if greedy(replica.url, prompt) != self.reference[prompt]:
                self.wrong.append((replica.url, prompt))
            self.answers += 1
            sent += 1

    def __enter__(self) -> "Traffic":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=300)


def roll_out(replicas, path: Path, capsys) -> tuple[int, dict]:
    addresses = sum((["--replica", r.admin_address] for r in replicas), [])
    code = main(["admin", "load-drafter", *addresses, "--token-file", str(replicas[0].admin_token), "--json",
                 "--path", str(path), *WINDOW])
    return code, json.loads(capsys.readouterr().out)


def test_a_worse_drafter_is_rolled_back_from_its_canary_and_a_better_one_promoted(
        gate_limits_server, dspark_server, tmp_path, capsys):
    replicas = [gate_limits_server, dspark_server]  # the canary first
    clients = [replica.client(replica.admin_token) for replica in replicas]
    served = [client.get().drafter for client in clients]
    worse = perturbed_copy(Path(served[0].path), tmp_path / "worse", scale=20.0)
    good = perturbed_copy(Path(served[0].path), tmp_path / "good", scale=1e-3)
    try:
        with Traffic(replicas) as traffic:
            code, report = roll_out(replicas, worse, capsys)
            assert code == 1 and [r["result"] for r in report["replicas"]] == ["rolled back", "not applied"], report
            assert "did not draft better" in report["summary"]
            assert [c.get().drafter.version for c in clients] == [s.version for s in served]

            clients[1].load_drafter(str(worse))  # now the fleet drafts worse than a good drafter would
            code, report = roll_out(replicas, good, capsys)
            assert code == 0 and [r["result"] for r in report["replicas"]] == ["applied", "applied"], report
            assert [c.get().drafter.version for c in clients] == [target_fingerprint(good)] * 2
        assert traffic.answers > 0 and not traffic.wrong, traffic.wrong[:3]
        print(f"{traffic.answers} answers, all the target's; canary: {report['replicas'][0]['detail']}")
    finally:
        for client, drafter in zip(clients, served):
            client.load_drafter(drafter.path)
            client.close()
