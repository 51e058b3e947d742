"""`dspark train --data FILE` trains on regenerated conversations end to end (the embedded target, a few steps)."""
import json

from test_train_command import no_model_before_the_checks

from dspark.ops.cli import main
from tests.paths import EMBEDDED_TARGET


def regenerated_file(path, count: int):
    """Records as `dspark regenerate` writes them: two-turn conversations, replies of the target's kind."""
    with path.open("w") as sink:
        for i in range(count):
            messages = [{"role": "user", "content": f"def read_{i}(path):"},
                        {"role": "assistant", "content": f"    with open(path) as f:\n        return f.read({i})"},
                        {"role": "user", "content": f"class Reader{i}:"},
                        {"role": "assistant", "content": "    def __init__(self):\n        self.items = []"}]
            sink.write(json.dumps({"index": i, "messages": messages, "reply_tokens": 20, "sampling": {}}) + "\n")
    return path


def test_train_on_regenerated_conversations(tmp_path, capsys):
    data = regenerated_file(tmp_path / "regen.jsonl", 24)
    out = tmp_path / "out"
    argv = ["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark", "--out", str(out), "--data", str(data),
            "--steps", "2", "--prompt-len", "8", "--response-len", "40", "--batch-size", "4", "--block-size", "3",
            "--num-layers", "1", "--markov-rank", "8", "--n-anchors", "4", "--eval-samples", "0", "--threads", "1",
            "--device", "cpu", "--log-every", "1"]
    assert main(argv) == 0
    info = json.loads((out / "train_log.json").read_text())["job"]
    assert info["steps"] == 2 and info["seq_len"] == 48
    assert info["samples"] < 24, "the held-out conversations are not trained on"
    assert "regenerated conversations of" in info["data_summary"]
    assert "--data" in info["command"]


def test_data_refuses_other_data_flags(tmp_path, capsys):
    data = regenerated_file(tmp_path / "regen.jsonl", 2)
    argv = ["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark", "--out", str(tmp_path / "o"),
            "--data", str(data), "--data-source", "corpus"]
    assert main(argv) == 2
    assert "--data is the training data: it takes no --prompts-file, --builtin-prompts or --data-source" in \
        capsys.readouterr().err


def test_a_sharded_target_with_a_sharded_drafter_refuses_the_held_out_check(tmp_path, capsys):
    data = regenerated_file(tmp_path / "regen.jsonl", 2)
    argv = ["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark", "--out", str(tmp_path / "o"),
            "--data", str(data), "--shard-target", "--fsdp", "--eval-samples", "4"]
    assert main(argv) == 2
    assert "with both, pass --eval-samples 0 (got 4)" in capsys.readouterr().err


def test_a_bad_data_file_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    data = regenerated_file(tmp_path / "regen.jsonl", 3)
    data.write_text(data.read_text() + '{"index": 1, "messages": []}\n')
    monkeypatch.setattr("dspark.models.training.run.target_and_drafter", no_model_before_the_checks)
    argv = ["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark", "--out", str(tmp_path / "o"),
            "--data", str(data), "--threads", "1", "--device", "cpu"]
    assert main(argv) == 2
    assert "regen.jsonl:4: index 1 again" in capsys.readouterr().err


def test_data_too_small_for_one_batch_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """--num-samples 1 (or a --data file of a few conversations) under --batch-size 8 failed at the first step,
    after the models had loaded and the data had been generated."""
    monkeypatch.setattr("dspark.models.training.run.target_and_drafter", no_model_before_the_checks)
    base = ["train", "--target", str(EMBEDDED_TARGET), "--drafter", "dspark", "--out", str(tmp_path / "o"),
            "--threads", "1", "--device", "cpu", "--batch-size", "8", "--data-cache", str(tmp_path / "cache")]
    assert main(base + ["--num-samples", "1"]) == 2
    assert "the training data has 1 samples, fewer than one global batch (8: --batch-size 8 x 1 rank(s))" in \
        capsys.readouterr().err
    data = regenerated_file(tmp_path / "regen.jsonl", 5)
    assert main(base + ["--data", str(data)]) == 2
    assert "samples, fewer than one global batch (8: --batch-size 8 x 1 rank(s))" in capsys.readouterr().err
