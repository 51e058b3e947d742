"""A drafter swapped into the running server (admin LoadDrafter, integration/drafter_swap.py): greedy requests in
flight during the swap all answered, identical to before; the new version in /server_info, the admin state, the
metrics, the audit log and the capture's records; drafters that do not fit refused by name with nothing loaded;
the original drafter swapped back."""
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from dspark.models.target_io import target_fingerprint
from tests.perturbed_drafter import perturbed_copy

PROMPTS = ["def parse(text):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):", "for line in f:"]
MAX_NEW_TOKENS = 64  # long enough that all are still in flight when the swap lands (waited for below)


def greedy(server, prompt: str) -> list[int]:
    reply = server.post("/generate", {"text": prompt, "sampling_params": {"temperature": 0,
                                                                          "max_new_tokens": MAX_NEW_TOKENS}})
    return reply["output_ids"]


def capture_records(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob("capture-*.jsonl")) for line in path.open()]


def refused(admin, path: Path) -> str:
    with pytest.raises(grpc.RpcError) as error:
        admin.load_drafter(str(path))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return error.value.details()


def test_a_drafter_is_swapped_live_with_requests_in_flight_and_a_misfit_refused(dspark_server_restored, tmp_path):
    server = dspark_server_restored
    admin = server.client(server.admin_token)
    original = admin.get().drafter
    assert original.version == target_fingerprint(Path(original.path))
    before = {prompt: greedy(server, prompt) for prompt in PROMPTS}
    candidate = perturbed_copy(Path(original.path), tmp_path / "candidate", scale=0.05)
    new_version = target_fingerprint(candidate)
    assert new_version != original.version
    try:
        with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
            in_flight = [(prompt, pool.submit(greedy, server, prompt)) for prompt in PROMPTS * 2]
            assert server.wait_for_in_flight(len(in_flight)), "the requests reach the server before the swap"
            swapped = admin.load_drafter(str(candidate))
            answers = [(prompt, future.result(timeout=300)) for prompt, future in in_flight]
        assert swapped.drafter.version == new_version and swapped.previous.version == original.version
        assert swapped.drafter.swaps == original.swaps + 1
        assert all(answer == before[prompt] for prompt, answer in answers), "every request answered, as before"
        assert {prompt: greedy(server, prompt) for prompt in PROMPTS} == before, "the new drafter: the same text"

        assert admin.get().drafter.version == new_version
        assert server.get("/server_info")["internal_states"][0]["dspark"]["drafter"]["version"] == new_version
        assert server.metric(f'dspark_drafter_info{{version="{new_version}"}}') == 1
        assert server.metric(f'dspark_drafter_info{{version="{original.version}"}}') == 0
        audit = json.loads(server.audit_log.read_text().splitlines()[-1])
        assert audit["rpc"] == "LoadDrafter" and audit["result"] == "applied"
        assert audit["diff"]["drafter"] == [original.version, new_version]

        capture = server.folder.parent / "capture"  # conftest's dspark_server captures every reply there
        deadline = time.monotonic() + 30
        while not any(r["prompt"] == PROMPTS[0] and r["drafter"]["sha256"] == new_version
                      for r in capture_records(capture) if "prompt" in r):
            assert time.monotonic() < deadline, "a reply served after the swap is captured with the new version"
            time.sleep(0.2)

        wider = tmp_path / "wider"  # another block size: another drafter, refused before anything is loaded
        shutil.copytree(candidate, wider)
        config = json.loads((wider / "config.json").read_text())
        (wider / "config.json").write_text(json.dumps({**config, "block_size": config["block_size"] + 1}))
        assert "is another drafter than the one served: block_size" in refused(admin, wider)
        elsewhere = tmp_path / "elsewhere"  # trained for another target
        shutil.copytree(candidate, elsewhere)
        log = json.loads((elsewhere / "train_log.json").read_text())
        log["job"]["target_sha256"] = "0" * 64
        (elsewhere / "train_log.json").write_text(json.dumps(log))
        assert "was trained for another target: its train_log.json records target_sha256 0000" in \
            refused(admin, elsewhere)
        assert "is not a drafter folder" in refused(admin, tmp_path / "missing")
        assert admin.get().drafter.version == new_version, "a refused drafter loads nothing"
        assert greedy(server, PROMPTS[1]) == before[PROMPTS[1]]
    finally:
        back = admin.load_drafter(original.path)
        admin.close()
    assert back.drafter.version == original.version
