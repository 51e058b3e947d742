"""Every flag is bounded where argparse parses it (ops/arg_types.py), and every key or token file is read with a
bound (ops/admin/security.read_secret): a value out of range is refused naming the flag, the bound and the value,
before any model loads or any server starts."""
import argparse
import os

import pytest

from dspark.ops.arg_types import output_dir, output_file
from dspark.ops.cli import main

from tests.paths import EMBEDDED, EMBEDDED_TARGET

MODELS = ["--target", str(EMBEDDED_TARGET), "--drafter", str(EMBEDDED / "dspark")]


@pytest.mark.parametrize("command, flag, value, bound", [
    (["generate", *MODELS, "--prompt", "x"], "--seed", str(2**74), "[0, 4294967295]"),
    (["generate", *MODELS, "--prompt", "x"], "--threads", "100000", "[1, 1024]"),
    (["generate", *MODELS, "--prompt", "x"], "--batch-size", "100000000", "[1, 1024]"),
    (["generate", *MODELS, "--prompt", "x"], "--num-samples", "100000000", "[1, 10000]"),
    (["generate", *MODELS, "--prompt", "x"], "--max-new-tokens", "0", "[1, 1048576]"),
    (["demo"], "--max-new-tokens", str(10**9), "[1, 1048576]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--seed", "-1", "[0, 4294967295]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--data-seed", str(2**62), "[0, 4294967295]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--batch-size", "5000", "[1, 1024]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--n-anchors", "1000000000", "[1, 65536]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--block-size", "0", "[1, 64]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--keep-checkpoints", "0", "[1, 10000]"),
    (["bench-sched", *MODELS, "--prompts-file", "p", "--out", "o"], "--concurrency", "0", "[1, 1024]"),
    (["bench-sched", *MODELS, "--prompts-file", "p", "--out", "o"], "--simulate-to", "-1", "[0, 4096]"),
    (["bench-sched", *MODELS, "--prompts-file", "p", "--out", "o"], "--limit", "-3", "[1, 100000]"),
    (["serve", "--target", str(EMBEDDED_TARGET)], "--port", "99999999", "[1, 65535]"),
    (["serve", "--target", str(EMBEDDED_TARGET)], "--max-running-requests", "-3", "[1, 65536]"),
    (["serve", "--target", str(EMBEDDED_TARGET)], "--max-total-tokens", "-1", "[1, 2147483647]"),
    (["admin-server", "--sglang-url", "http://127.0.0.1:1"], "--admin-metrics-port", "99999", "[0, 65535]"),
    (["chat-prompts", "--count", "10", "--out", "o"], "--seed", "-5", "[0, 4294967295]"),
    (["regenerate", "--input", "i", "--out", "o", "--endpoint", "http://h:1"], "--limit", "0", "[1, 100000000]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--held-out-percent", "100", "[1, 99]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--eval-samples", "100000", "[0, 10000]"),
    (["train", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--num-samples", "0", "[1, 10000000]"),
    (["embedded-target", "--steps", "1"], "--seed", str(2**70), "[0, 4294967295]"),
    (["embedded-target", "--steps", "1"], "--vocab", str(10**12), "[1, 1048576]"),
    (["embedded-target", "--steps", "1"], "--seq-len", "-4", "[1, 65536]"),
    (["embedded-target", "--seed", "1"], "--steps", "0", "[1, 1000000000]"),
    (["admin", "watch", "--replica", "h:1"], "--duration", "1e300", "[0.1, 604800]"),
    (["admin", "watch", "--replica", "h:1"], "--interval", "0.001", "[0.1, 3600]"),
    (["admin", "watch", "--replica", "h:1"], "--timeout", "0", "[0.1, 3600]"),
    (["admin", "restart", "--replica", "h:1"], "--restart-timeout", "1e9", "[0, 14400]"),
    (["admin", "set", "--replica", "h:1"], "--canary", "-1", "[0, 10000]"),
    (["admin", "calibrate", "--replica", "h:1"], "--min-samples", "4097", "[0, 4096]"),  # the live windows' sizes
    (["admin", "profile-sps", "--replica", "h:1", "--from-traffic"], "--min-samples", "2049", "[0, 2048]"),
    (["bench-trace", *MODELS, "--prompts-file", "p"], "--repeats", "0", "[1, 1000]"),
    (["profile-sps", "--target", str(EMBEDDED_TARGET), "--out", "o"], "--repeats", "0", "[1, 1000]"),
])
def test_a_flag_out_of_range_is_refused_by_argparse(capsys, command, flag, value, bound):
    with pytest.raises(SystemExit) as refused:
        main(command + [flag, value])
    assert refused.value.code == 2
    assert f"argument {flag}: must be in {bound}, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["foo", "http://h:99999", "http://h:abc", "ftp://h:1", "http://:80"])
def test_a_server_url_that_is_not_one_is_refused_by_argparse(capsys, url):
    with pytest.raises(SystemExit):
        main(["soak", "--url", url, "--target", str(EMBEDDED_TARGET), "--out", "o"])
    error = capsys.readouterr().err
    assert "argument --url: must be an http(s) URL" in error and repr(url) in error


def test_a_negative_drain_timeout_is_refused_before_sglang_starts(capsys):
    assert main(["serve", "--target", str(EMBEDDED_TARGET), "--no-spec", "--drain-timeout", "-1", "--dry-run"]) == 2
    assert "--drain-timeout must be in [0, 86400] seconds, got -1" in capsys.readouterr().err


def test_a_gpu_check_with_no_time_is_refused_rather_than_passing_empty(capsys):
    assert main(["gpu-check", "--budget-s", "0"]) == 2
    assert "--budget-s must be in (0, 86400], got 0" in capsys.readouterr().err


def test_the_restart_signal_goes_only_to_the_parent_process(tmp_path, capsys):
    token = tmp_path / "ops"
    token.write_text("o" * 32)
    command = ["admin-server", "--sglang-url", "http://127.0.0.1:1", "--admin-port", "0", "--admin-token-file",
               str(token), "--supervisor-folder", str(tmp_path)]
    assert main(command + ["--supervisor-pid", "-1"]) == 2  # os.kill(-1, ...) signals every process it may
    parent = os.getppid()
    assert f"--supervisor-pid must be this process's parent (the `dspark serve` that started it, pid {parent}), " \
           "got -1" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe" + b"k" * 30, "is not UTF-8 text (byte 0)"),
    (b"k" * 5000, "is over 4096 bytes: not a key or token file"),
    (b"k" * 20 + b"\n" + b"k" * 20 + b"\n", r"holds a control character at 20 ('\n'): one line of printable text"),
])
def test_a_key_file_that_is_not_one_is_refused_by_name(tmp_path, capsys, content, message):
    key = tmp_path / "key"
    key.write_bytes(content)
    commands = [
        ["serve", "--target", str(EMBEDDED_TARGET), "--no-spec", "--http-admin-key-file", str(key), "--dry-run"],
        ["regenerate", "--input", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out.jsonl"), "--endpoint",
         "http://127.0.0.1:1/v1", "--model", "m", "--api-key-file", str(key)],
        ["admin", "get", "--replica", "127.0.0.1:1", "--token-file", str(key)],
    ]
    for command in commands:
        assert main(command) == 2, command[0]
        assert f"{key} {message}" in capsys.readouterr().err, command[0]


@pytest.mark.parametrize("command", [["generate", *MODELS, "--prompt", "x"],
                                     ["profile-sps", "--target", str(EMBEDDED_TARGET)],
                                     ["train", "--target", str(EMBEDDED_TARGET), "--out", "o"]])
@pytest.mark.parametrize("device, message", [("foo", "must be cpu, cuda or cuda:N, got 'foo'"),
                                             ("meta", "must be cpu, cuda or cuda:N, got 'meta'"),
                                             ("cuda:64", "'cuda:64' is not one of the")])
def test_a_device_that_is_not_here_is_refused_by_argparse(capsys, command, device, message):
    with pytest.raises(SystemExit):
        main(command + ["--device", device])
    assert f"argument --device: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("command, flag, kind", [
    (["generate", *MODELS, "--prompt", "x"], "--json", "file"),
    (["eval", *MODELS, "--datasets", "d.jsonl"], "--json", "file"),
    (["regenerate", "--input", "i", "--endpoint", "http://h:1"], "--out", "file"),
    (["self-chat", "--target", str(EMBEDDED_TARGET), "--count", "1"], "--out", "file"),
    (["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark"], "--out", "directory"),
    (["demo"], "--out", "directory"),
    (["bench-serve"], "--out", "directory"),
])
def test_an_output_path_of_the_wrong_kind_is_refused_by_argparse(tmp_path, capsys, command, flag, kind):
    """A directory where a file goes (or a file where a directory goes) was an IsADirectoryError, or a
    FileExistsError, only when the results were written: after the model load, the decoding or the training."""
    wrong = tmp_path / "wrong"
    wrong.mkdir() if kind == "file" else wrong.write_text("")
    with pytest.raises(SystemExit) as refused:
        main(command + [flag, str(wrong)])
    assert refused.value.code == 2
    expected = "is a directory" if kind == "file" else "is not a directory"
    assert f"argument {flag}: {str(wrong)!r} exists and {expected}" in capsys.readouterr().err


def test_an_output_path_under_a_file_is_refused_by_argparse(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        main(["generate", *MODELS, "--prompt", "x", "--json", str(blocker / "sub" / "out.json")])
    assert f"cannot be created: {str(blocker)!r} is not a directory this process may write" in capsys.readouterr().err


def test_an_output_file_may_be_a_device_a_pipe_or_new_under_missing_folders(tmp_path):
    """`--json /dev/stdout | jq` hands the command a pipe: as valid a place to write as a file."""
    os.mkfifo(tmp_path / "pipe")
    for valid in ("/dev/null", str(tmp_path / "pipe"), str(tmp_path / "a" / "b" / "c.json")):
        assert str(output_file(valid)) == valid
    assert output_dir(str(tmp_path)) == tmp_path


def test_an_output_path_the_file_system_refuses_is_an_argparse_error_not_a_traceback(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="cannot be used: File name too long"):
        output_file(str(tmp_path / ("x" * 300) / "out.json"))


def no_weights(*args, **kwargs):
    raise AssertionError("the target's weights were loaded before the flags were checked")


@pytest.mark.parametrize("command, message", [
    (["generate", *MODELS, "--prompt", "x", "--max-new-tokens", "5000"],
     "--max-new-tokens 5000 leaves no room for a prompt in the target's 2048 positions"),
    (["profile-sps", "--target", str(EMBEDDED_TARGET), "--out", "OUT/sps.json", "--batch-tokens", "4", "4"],
     "--batch-tokens must be distinct positive sizes, got [4, 4]"),
    (["profile-sps", "--target", str(EMBEDDED_TARGET), "--out", "OUT/sps.json", "--batch-tokens", "65536",
      "--tokens-per-request", "1", "--context-len", "4096"], "the probes would cache 268435456 tokens"),
    (["bench-sched", *MODELS, "--prompts-file", "OUT/p.jsonl", "--out", "OUT/b", "--sps-table", "OUT/none.json"],
     "none.json does not exist or is not a file"),
    (["bench-serve", *MODELS, "--prompts-file", "OUT/p.jsonl", "--out", "OUT/b", "--sps-table", "OUT/none.json"],
     "none.json does not exist or is not a file"),
])
def test_a_run_that_cannot_work_is_refused_before_the_weights_load(tmp_path, capsys, monkeypatch, command, message):
    """Each was refused only after the target had loaded (profile-sps, bench-sched, generate), or after SGLang
    had started and served a whole run without speculation (bench-serve)."""
    monkeypatch.setattr("dspark.ops.commands.decoding_args.load_target", no_weights)
    monkeypatch.setattr("dspark.ops.commands.profile_sps.load_target", no_weights)
    monkeypatch.setattr("dspark.ops.harness.bench_serve.no_spec_runs", no_weights)
    (tmp_path / "p.jsonl").write_text('{"turns": ["hi"]}\n')
    assert main([part.replace("OUT", str(tmp_path)) for part in command]) == 2
    assert message in capsys.readouterr().err
