"""`dspark serve --dry-run`: the SGLang command and environment it would start, and its input checks."""
import json
import re
import shlex

import pytest

from dspark.ops.cli import build_parser, main
from dspark.ops.commands.serve import admin_key

from tests.paths import EMBEDDED, EMBEDDED_TARGET

BASE = ["serve", "--target", str(EMBEDDED_TARGET), "--device", "cpu", "--dry-run"]


def dry_run(capsys, *args) -> tuple[dict, list[str]]:
    assert main(BASE + list(args)) == 0
    words = shlex.split(capsys.readouterr().out)
    env = dict(w.split("=", 1) for w in words[: words.index("-m") - 1])
    return env, words[words.index("-m") - 1:]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_dspark_on_cpu_uses_the_cpu_recipe_ragged_verify_and_the_runtime_state(capsys):
    env, command = dry_run(capsys, "--drafter", str(EMBEDDED / "dspark"), "--policy", "threshold",
                           "--threshold", "0.4", "--max-verify-length", "3", "--port", "31234")
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert flag(command, "--speculative-algorithm") == "DSPARK"
    assert flag(command, "--speculative-draft-model-path") == str((EMBEDDED / "dspark").resolve())
    assert flag(command, "--speculative-draft-attention-backend") == "torch_native"
    assert flag(command, "--device") == "cpu" and flag(command, "--dtype") == "float32"
    assert {"--disable-cuda-graph", "--disable-overlap-schedule", "--sleep-on-idle"} <= set(command)
    assert flag(command, "--port") == "31234"
    assert env["SGLANG_USE_CPU_ENGINE"] == env["TORCH_COMPILE_DISABLE"] == "1"
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    state = json.loads(env["DSPARK_RUNTIME_STATE"])
    assert state["policy"] == "threshold" and state["threshold"] == 0.4 and state["max_verify_length"] == 3


def test_no_spec_serves_the_target_alone_and_passes_sglang_arguments_through(capsys):
    env, command = dry_run(capsys, "--no-spec", "--max-total-tokens", "4096", "--", "--log-level", "warning")
    assert "--speculative-algorithm" not in command and "DSPARK_RUNTIME_STATE" not in env
    assert flag(command, "--max-total-tokens") == "4096" and command[-2:] == ["--log-level", "warning"]


def test_a_given_sps_table_reaches_sglang_and_the_state(capsys, tmp_path):
    table = tmp_path / "sps.json"
    table.write_text(json.dumps({"sample_batch_tokens": [1, 8], "sample_steps_per_sec": [50.0, 40.0],
                                 "max_batch_tokens": 8}))
    env, command = dry_run(capsys, "--drafter", str(EMBEDDED / "dspark"), "--sps-table", str(table))
    assert flag(command, "--speculative-dspark-sps-table-path") == str(table.resolve())
    assert json.loads(env["DSPARK_RUNTIME_STATE"])["sps_table"] == str(table.resolve())


@pytest.mark.parametrize("args, problem", [
    (["--drafter", str(EMBEDDED / "smollm2-dspark-regen")], "does not fit the target: hidden_size is 576"),
    (["--drafter", str(EMBEDDED / "dspark"), "--policy", "threshold", "--threshold", "2"], "threshold must be in [0, 1]"),
    (["--drafter", str(EMBEDDED / "dspark"), "--max-verify-length", "9"], "max_verify_length must be in"),
    (["--drafter", str(EMBEDDED / "dspark"), "--budget-fraction", "0"], "budget_fraction must be in (0, 1]"),
    (["--drafter", str(EMBEDDED / "dspark"), "--sps-table", "/nonexistent.json"], "does not exist"),
    (["--drafter", "/nonexistent-drafter"], "config.json is missing"),
    (["--drafter", str(EMBEDDED / "dspark"), "--sts", "/nonexistent-sts.json"],
     "STS calibration /nonexistent-sts.json does not exist or is not a file"),
])
def test_bad_input_is_one_clear_error_before_anything_starts(capsys, args, problem):
    assert main(BASE + args) == 2
    captured = capsys.readouterr()
    assert problem in captured.err and "sglang.launch_server" not in captured.out


def test_the_admin_sidecar_and_sglangs_admin_key_never_on_a_command_line(capsys, tmp_path):
    token = tmp_path / "ops"
    token.write_text("s3cret-admin-token-0123456789\n")
    assert main(BASE + ["--drafter", str(EMBEDDED / "dspark"), "--port", "31235", "--admin-port", "31236",
                        "--admin-token-file", str(token)]) == 0
    sglang_line, sidecar_line = capsys.readouterr().out.strip().splitlines()
    assert "s3cret" not in sglang_line + sidecar_line
    sglang, sidecar = shlex.split(sglang_line), shlex.split(sidecar_line)
    assert flag(sglang, "--config").endswith("port-31235/sglang-secrets.yaml")  # SGLang's --admin-api-key
    assert sidecar[1:5] == ["-m", "dspark.ops.cli", "admin-server", "--sglang-url"]
    assert flag(sidecar, "--sglang-url") == "http://127.0.0.1:31235" and flag(sidecar, "--admin-port") == "31236"
    assert flag(sidecar, "--admin-token-file") == str(token.resolve())


@pytest.mark.parametrize("key, problem", [
    ("abc", "holds a key of 3 characters; use at least 16"),
    ("-" + "x" * 31, "starts with '-', which SGLang reads as a flag"),  # SGLang passes it as `--admin-api-key KEY`
])
def test_an_unusable_http_admin_key_is_refused_by_name(capsys, tmp_path, key, problem):
    (tmp_path / "key").write_text(key)
    assert main(BASE + ["--no-spec", "--http-admin-key-file", str(tmp_path / "key")]) == 2
    assert f"admin key file {tmp_path / 'key'} " in (err := capsys.readouterr().err) and problem in err


def test_a_generated_admin_key_is_hex_so_sglang_never_reads_it_as_a_flag():
    argv = BASE + ["--drafter", str(EMBEDDED / "dspark")]
    args = build_parser(argv).parse_args(argv)
    keys = {admin_key(args) for _ in range(64)}
    assert len(keys) == 64 and all(re.fullmatch("[0-9a-f]{64}", key) for key in keys)


@pytest.mark.parametrize("args, problem", [
    (["--admin-port", "50051"], "the admin API needs credentials"),
    (["--admin-port", "50051", "--admin-token-file", "/nonexistent/token"], "does not exist"),
    (["--admin-port", "50051", "--admin-token-file", "SHORT"], "use at least 16"),
    (["--admin-port", "50051", "--admin-token-file", "LONG", "--admin-host", "0.0.0.0"], "without TLS"),
    (["--admin-port", "70000", "--admin-token-file", "LONG"], "--admin-port must be in 0..65535"),
])
def test_bad_admin_settings_stop_serve_before_anything_starts(capsys, tmp_path, args, problem):
    (tmp_path / "SHORT").write_text("abc")
    (tmp_path / "LONG").write_text("x" * 32)
    args = [str(tmp_path / a) if a in ("SHORT", "LONG") else a for a in args]
    assert main(BASE + ["--drafter", str(EMBEDDED / "dspark")] + args) == 2
    assert problem in capsys.readouterr().err

