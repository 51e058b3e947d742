"""`dspark serve --profile-sps-only`, what the chart's SPS Job runs: SGLang starts with dspark's plugin, its
schedulers measure the SPS table by SGLang's own forward and cache it under $DSPARK_SPS_DIR, and once the server
serves the command stops it and exits 0, leaving the table where the serving pods' next start finds it."""
import os
import subprocess
import sys

import pytest

from dspark.integration.server import free_port
from dspark.kernels.sps import SpsTable
from dspark.models.decoding.sps_paths import SPS_DIR_ENV
from dspark.models.decoding.sps_profile import load_sps
from tests.paths import EMBEDDED, EMBEDDED_TARGET
from tests.server_starts import record_server_start

pytestmark = pytest.mark.slow


def test_profile_sps_only_leaves_a_measured_table_and_exits_zero(tmp_path):
    tables = tmp_path / "sps"
    command = [sys.executable, "-m", "dspark.ops.cli", "serve", "--target", str(EMBEDDED_TARGET), "--drafter",
               str(EMBEDDED / "dspark"), "--device", "cpu", "--port", str(free_port()), "--profile-sps-only"]
    env = {**os.environ, "DSPARK_CACHE": str(tmp_path / "cache"), SPS_DIR_ENV: str(tables)}
    env.pop("TRITON_INTERPRET", None)
    record_server_start("dspark serve")
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, [line for line in done.stderr.splitlines() if "error" in line.lower()][-5:]
    assert f"its SPS table is cached under {tables / 'sglang'}" in done.stderr
    [table] = (tables / "sglang").glob("target-*.json")
    assert len(load_sps(table).sample_batch_tokens) > 1  # a measured table the next start reads as "cached"


def test_profile_sps_only_refuses_a_given_table(tmp_path):
    table = tmp_path / "given.json"
    SpsTable.from_probes({1: 1.0, 8: 0.9}).save(table)
    done = subprocess.run([sys.executable, "-m", "dspark.ops.cli", "serve", "--target", str(EMBEDDED_TARGET),
                           "--drafter", str(EMBEDDED / "dspark"), "--device", "cpu", "--profile-sps-only",
                           "--sps-table", str(table)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DSPARK_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and "--profile-sps-only measures the SPS table" in done.stderr
