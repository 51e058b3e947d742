"""A `dspark train` killed midway and run again with --resume ends exactly where an uninterrupted run ends: the
checkpoint carries the optimizer, the schedule, the RNG, the data position (the step: data order and anchors are
functions of it) and the held-out checks, so the exported best drafter, its held-out tau and the loss history are
the same; TensorBoard event files and train_log.json record the run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from test_train_data_command import regenerated_file

from tests.paths import EMBEDDED_TARGET, REPO

pytestmark = pytest.mark.slow
STEPS, KILL_AT = 40, 5


def command(out, data, cache, *extra) -> list[str]:
    return [sys.executable, "-m", "dspark.ops.cli", "train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark",
            "--out", str(out), "--data", str(data), "--data-cache", str(cache), "--steps", str(STEPS),
            "--checkpoint-every", "1", "--eval-every", "4", "--eval-samples", "2", "--prompt-len", "8",
            "--response-len", "40", "--batch-size", "4", "--block-size", "3", "--num-layers", "1", "--markov-rank",
            "8", "--n-anchors", "8", "--threads", "1", "--device", "cpu", "--log-every", "2", "--save-dtype",
            "float32", *extra]


def latest_step(out) -> int:
    pointer = out / "work" / "checkpoints" / "latest"
    return int(pointer.read_text().strip().removeprefix("step_")) if pointer.exists() else 0  # replaced atomically


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    data, cache = regenerated_file(tmp_path / "regen.jsonl", 60), tmp_path / "cache"
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = subprocess.run(command(whole, data, cache), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    first = subprocess.Popen(command(killed, data, cache), cwd=REPO, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while latest_step(killed) < KILL_AT:
        assert first.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    stopped_at = latest_step(killed)
    assert KILL_AT <= stopped_at < STEPS and not (killed / "model.safetensors").exists(), "killed midway"
    again = subprocess.run(command(killed, data, cache, "--resume"), cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]

    one, two = (load_file(run / "model.safetensors") for run in (whole, killed))
    assert all(torch.equal(one[name], two[name]) for name in one), "the same drafter, bit for bit"
    logs = [json.loads((run / "train_log.json").read_text()) for run in (whole, killed)]
    assert logs[0]["history"] == [{**e, "wall_s": logs[0]["history"][i]["wall_s"]}
                                  for i, e in enumerate(logs[1]["history"])], "the same loss history"
    jobs = [log["job"] for log in logs]
    assert [e["step"] for e in jobs[0]["held_out_every"]] == list(range(4, STEPS + 1, 4))
    assert jobs[1]["held_out_every"] == jobs[0]["held_out_every"]
    assert jobs[1]["exported_best"] == jobs[0]["exported_best"] == max(jobs[0]["held_out_every"],
                                                                      key=lambda e: e["tau"])
    assert jobs[1]["held_out"]["tau"] == pytest.approx(jobs[0]["exported_best"]["tau"]), "the export is the best"
    assert list((killed / "work" / "tensorboard").glob("events.out.tfevents.*")), "TensorBoard event files"
