"""`dspark regenerate`'s input checks: each bad flag is one error naming it, before any backend starts."""
import json

import pytest

from dspark.ops.cli import main


@pytest.mark.parametrize("args, problem", [
    (["--endpoint", "http://127.0.0.1:9", "--api-key-file", "/nonexistent/key"],
     "--api-key-file /nonexistent/key does not exist"),
    (["--target", "/nonexistent", "--api-key-file", "/nonexistent/key"], "read with --endpoint only"),
    (["--endpoint", "http://127.0.0.1:9", "--limit", "0"], "--limit must be >= 1, got 0"),
    (["--endpoint", "http://127.0.0.1:9", "--device", "cpu"], "an --endpoint runs where it is served"),
    (["--endpoint", "http://127.0.0.1:9", "--top-p", "0"], "--top-p must be in (0, 1], got 0"),
    (["--target", "/nonexistent"], "--target /nonexistent is not a model directory"),
])
def test_bad_input_is_one_error_naming_the_flag(tmp_path, capsys, args, problem):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Say hi."}) + "\n")
    assert main(["regenerate", "--input", str(prompts), "--out", str(tmp_path / "out.jsonl"), *args]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
