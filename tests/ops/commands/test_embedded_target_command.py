"""`dspark embedded-target` on a tiny stdlib: writes a loadable model whose card holds a command that
parses back to the same options; bad settings are one clear line."""
import json
import shlex

import pytest
from transformers import AutoModelForCausalLM

from dspark.ops.cli import build_parser, main

TINY = ["--hidden", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
        "--intermediate", "64", "--vocab", "300", "--seq-len", "32", "--batch-size", "4", "--steps", "4",
        "--eval-every", "0", "--threads", "1", "--held-out-percent", "30", "--lr", "0.003"]


@pytest.fixture
def tiny_stdlib(tmp_path):
    lib = tmp_path / "lib"
    for i in range(12):
        (lib / f"pkg{i % 3}").mkdir(parents=True, exist_ok=True)
        body = "\n".join(f"def f{j}(x):\n    return x * {i} + {j}\n" for j in range(30))
        (lib / f"pkg{i % 3}" / f"mod{i}.py").write_text(body)
    return lib


def test_writes_model_card_and_log_with_a_reproducing_command(tiny_stdlib, tmp_path, capsys):
    out = tmp_path / "target"
    assert main(["embedded-target", "--out", str(out), "--stdlib", str(tiny_stdlib), *TINY]) == 0
    assert "held-out perplexity" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 4 and log["command"] in (out / "README.md").read_text()
    argv = shlex.split(log["command"])
    assert argv[0] == "dspark"
    again = build_parser().parse_args(argv[1:])
    original = build_parser().parse_args(["embedded-target", "--out", str(out), "--stdlib", str(tiny_stdlib), *TINY])
    assert {k: v for k, v in vars(again).items() if k not in ("func", "_parser")} == {
        k: v for k, v in vars(original).items() if k not in ("func", "_parser")}


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--kv-heads", "3"], "multiple of num_kv_heads"), (["--lr", "0"], "lr must be positive")],
)
def test_bad_settings_are_one_clear_line(extra, message, tiny_stdlib, tmp_path, capsys):
    assert main(["embedded-target", "--out", str(tmp_path / "o"), "--stdlib", str(tiny_stdlib), *TINY, *extra]) == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("dspark embedded-target: error:") and message in last_line
