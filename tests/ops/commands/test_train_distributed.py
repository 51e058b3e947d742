"""Two gloo processes under torchrun train the same drafter as one process on the same data: each rank writes its
shard of the feature store, reads its half of every global batch from the memory-mapped store, and the averaged
gradients (DDP's all-reduce, or FSDP2's reduce-scatter with --fsdp), scaled by the world size over globally summed
loss normalisers, give one process's steps. With --shard-target the target's layers are sharded over the two ranks
instead: the store's features and so the steps are again one process's.

Tolerance: the two runs differ only in float32 summation order (the gradient all-reduce, the per-rank loss sums)
and in the feature store's bf16 rounding of features computed in batches of other widths, so losses agree to 1e-4
relative and weights after 4 AdamW steps of lr 6e-4 to 1e-4 absolute (Adam's step is at most lr a step; a
difference in its sign would show as ~1e-3)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file
from test_train_data_command import regenerated_file

from dspark.integration.server import free_port

from tests.paths import EMBEDDED_TARGET, REPO

pytestmark = pytest.mark.slow
STEPS = 4


def train_argv(out, data, store, batch_size: int) -> list[str]:
    # 64 anchors cover every candidate of a 48-token sample: anchor sampling draws them all on any rank.
    return ["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark", "--out", str(out), "--data", str(data),
            "--feature-cache", str(store), "--steps", str(STEPS), "--prompt-len", "8", "--response-len", "40",
            "--batch-size", str(batch_size), "--block-size", "3", "--num-layers", "1", "--markov-rank", "8",
            "--n-anchors", "64", "--eval-samples", "0", "--threads", "1", "--device", "cpu", "--log-every", "1",
            "--save-dtype", "float32"]


def run(command: list[str], cwd) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "-m", "dspark.ops.cli"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The data file and the run of one process with the global batch (4)."""
    root = tmp_path_factory.mktemp("one-process")
    data = regenerated_file(root / "regen.jsonl", 24)
    run([sys.executable, "-m", "dspark.ops.cli", *train_argv(root / "one", data, root / "store-one", 4)], REPO)
    return data, root / "one"


SHARDING_FLAGS = {"ddp": [], "fsdp": ["--fsdp"], "shard-target": ["--shard-target"]}


@pytest.mark.parametrize("sharding", list(SHARDING_FLAGS))
def test_two_gloo_ranks_train_as_one_process(one_process, tmp_path, sharding):
    data, one_out = one_process
    extra = SHARDING_FLAGS[sharding]
    run([*torchrun(), *train_argv(tmp_path / "two", data, tmp_path / "store-two", 2), *extra, "--checkpoint-every", "2"],
        REPO)
    assert len(list((tmp_path / "store-two").glob("*/shard-*.hidden.bf16"))) == 2, "one shard per rank"
    logs = [json.loads((out / "train_log.json").read_text()) for out in (one_out, tmp_path / "two")]
    assert logs[1]["job"]["world_size"] == 2 and logs[0]["job"]["samples"] == logs[1]["job"]["samples"]
    assert logs[1]["job"]["fsdp"] == (sharding == "fsdp")
    assert logs[1]["job"]["shard_target"] == (sharding == "shard-target")
    losses = [[entry["loss"] for entry in log["history"]] for log in logs]
    assert len(losses[0]) == STEPS and losses[1] == pytest.approx(losses[0], rel=1e-4)
    one, two = (load_file(out / "model.safetensors") for out in (one_out, tmp_path / "two"))
    assert one.keys() == two.keys()
    moved = max((one[name] - two[name]).abs().max().item() for name in one)
    assert moved <= 1e-4, f"weights differ by up to {moved}"
    if sharding == "fsdp":  # resume from the middle: the gathered optimizer state goes back into the shards
        (tmp_path / "two" / "work" / "checkpoints" / "latest").write_text("step_0000002\n")
        run([*torchrun(), *train_argv(tmp_path / "two", data, tmp_path / "store-two", 2), *extra, "--resume"], REPO)
        resumed = load_file(tmp_path / "two" / "model.safetensors")
        assert all((resumed[name] - two[name]).abs().max() <= 1e-6 for name in two), "steps 3-4 again, the same"


def test_a_sharded_target_checks_held_out_on_every_rank(one_process, tmp_path):
    """The held-out set's replies, the periodic checks and the final one run the sharded target's forwards, which
    are collectives: both ranks run them together (a rank left out would hang the run past the timeout)."""
    data, _ = one_process
    argv = train_argv(tmp_path / "checked", data, tmp_path / "store", 2)
    argv[argv.index("--eval-samples") + 1] = "2"
    run([*torchrun(), *argv, "--shard-target", "--eval-every", "2"], REPO)
    job = json.loads((tmp_path / "checked" / "train_log.json").read_text())["job"]
    assert job["shard_target"] and [check["step"] for check in job["held_out_every"]] == [2, 4]
    assert job["held_out"]["tau"] >= 1.0 and job["held_out"]["decoded_tau"] >= 1.0
