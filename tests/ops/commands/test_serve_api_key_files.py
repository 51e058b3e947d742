"""`dspark serve --api-key-file`: the keys reach the plugin through a private file named in the environment, never
the command line, and a key file that cannot serve is refused at start naming the file."""
import shlex

import pytest

from dspark.integration.api_keys import API_KEYS_ENV, read_keys
from dspark.ops.cli import main
from dspark.ops.commands.serve import API_KEYS_FILE, write_secrets

from tests.paths import EMBEDDED_TARGET

BASE = ["serve", "--target", str(EMBEDDED_TARGET), "--no-spec", "--device", "cpu", "--dry-run"]
KEYS = ("current-key-0123456789abcdef", "next-key-fedcba9876543210")


def key_files(folder, *keys):
    args = []
    for i, key in enumerate(keys):
        (folder / f"key{i}").write_text(key + "\n")
        args += ["--api-key-file", str(folder / f"key{i}")]
    return args


def test_the_keys_are_named_in_the_environment_and_never_on_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    assert main(BASE + key_files(tmp_path, *KEYS)) == 0
    out = capsys.readouterr().out
    words = shlex.split(out)
    env = dict(w.split("=", 1) for w in words[: words.index("-m") - 1])
    assert env[API_KEYS_ENV].endswith(f"/{API_KEYS_FILE}") and not any(key in out for key in KEYS)
    assert main(BASE) == 0 and API_KEYS_ENV not in capsys.readouterr().out  # no key files: an open API


def test_the_hand_over_file_is_private_and_reads_back_and_a_start_without_keys_removes_it(tmp_path):
    folder = tmp_path / "secrets"
    write_secrets(folder, "admin-key-0123456789", list(KEYS))
    assert (folder / API_KEYS_FILE).stat().st_mode & 0o777 == 0o600
    assert read_keys(str(folder / API_KEYS_FILE)) == [key.encode() for key in KEYS]
    write_secrets(folder, "admin-key-0123456789", [])
    assert not (folder / API_KEYS_FILE).exists()


@pytest.mark.parametrize("keys, problem", [
    (("short",), "holds an API key of 5 characters; use at least 16"),
    ((KEYS[0], KEYS[0]), "holds the same API key twice"),
    (("a key with spaces in it",), "holds an API key with a space"),
])
def test_a_key_that_cannot_serve_is_refused_naming_the_flag(capsys, tmp_path, keys, problem):
    assert main(BASE + key_files(tmp_path, *keys)) == 2
    error = capsys.readouterr().err
    assert problem in error and "--api-key-file" in error
