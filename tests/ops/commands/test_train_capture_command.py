"""`dspark train --data CAPTURE_DIR --init-from-drafter DRAFTER`: the serving drafter trained further on captured
traffic (every capture file of the folder), keeping its settings, with a held-out slice never trained on and written
beside the run for `dspark eval`."""
import hashlib
import json

from test_train_command import no_model_before_the_checks

from dspark.integration.capture_records import record_line
from dspark.models.checkpoint import read_drafter_config
from dspark.models.prompts import read_turns
from dspark.ops.cli import main
from tests.paths import EMBEDDED, EMBEDDED_TARGET

SERVING_DRAFTER = EMBEDDED / "dspark"
HELD_OUT_PERCENT = 25


def capture_folder(folder, files: int, records: int):
    """A capture folder as `dspark serve --capture` leaves it: several files, each numbering its records from 0,
    each record as the writer builds it (integration/capture_records.py), and a file that is not a capture."""
    folder.mkdir()
    prompts = []
    for f in range(files):
        with (folder / f"capture-20261201T000000Z-host-1-{f}.jsonl").open("wb") as sink:
            for i in range(records):
                prompt = f"def load_{f}_{i}(path):"
                prompts.append(prompt)
                messages = [{"role": "user", "content": prompt},
                            {"role": "assistant", "content": f"    with open(path) as f:\n        return f.read({i})"}]
                sink.write(record_line(i, {"messages": messages, "reply_tokens": 18, "sampling": {"temperature": 0},
                                           "route": "/v1/chat/completions", "stream": False, "captured_at": 1.0}))
    (folder / "notes.txt").write_text("not a capture file\n")
    return prompts


def held_out(prompt: str) -> bool:
    """The rule as docs/traffic-loop.md states it, written out here to check the code against."""
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % 100 < HELD_OUT_PERCENT


def fine_tune_argv(out, data, *extra):
    return ["train", "--target", str(EMBEDDED_TARGET), "--init-from-drafter", str(SERVING_DRAFTER), "--data",
            str(data), "--out", str(out), "--held-out-percent", str(HELD_OUT_PERCENT), "--steps", "2",
            "--prompt-len", "8", "--response-len", "24", "--batch-size", "4", "--n-anchors", "4", "--eval-samples",
            "0", "--threads", "1", "--device", "cpu", "--log-every", "1", *extra]


def test_fine_tune_on_a_capture_folder_keeps_the_drafter_and_holds_a_slice_out(tmp_path):
    prompts = capture_folder(tmp_path / "capture", files=2, records=16)
    expected_held_out = [p for p in prompts if held_out(p)]
    assert 0 < len(expected_held_out) < len(prompts), "the test's prompts must fall on both sides of the split"
    out = tmp_path / "candidate"
    assert main(fine_tune_argv(out, tmp_path / "capture")) == 0

    serving, candidate = read_drafter_config(SERVING_DRAFTER), read_drafter_config(out)
    assert candidate == serving, "the fine-tune keeps every setting of the drafter it starts from"
    info = json.loads((out / "train_log.json").read_text())["job"]
    assert info["steps"] == 2 and info["init_from_drafter"].endswith("embedded/dspark")
    assert info["samples"] == len(prompts) - len(expected_held_out), "both files read, the held-out slice not trained"
    assert "--block-size 5" in info["command"] and "--markov-rank 64" in info["command"], \
        "the card's command spells out the settings it took from the drafter"
    assert info["held_out_slice"] == {
        "rule": f"sha256 of the first user turn in the lowest {HELD_OUT_PERCENT} of 100 buckets",
        "held_out_percent": HELD_OUT_PERCENT, "prompts": len(expected_held_out), "file": "held_out.jsonl"}
    held_out_file = out / "held_out.jsonl"
    assert read_turns(held_out_file) == expected_held_out
    assert held_out_file.stat().st_mode & 0o777 == 0o600, "the held-out prompts are users' text: private"


def test_a_drafter_flag_that_differs_from_the_drafter_is_refused_before_any_model_loads(tmp_path, capsys,
                                                                                       monkeypatch):
    capture_folder(tmp_path / "capture", files=1, records=8)
    monkeypatch.setattr("dspark.models.training.run.target_and_drafter", no_model_before_the_checks)
    assert main(fine_tune_argv(tmp_path / "o", tmp_path / "capture", "--block-size", "3")) == 2
    assert f"--init-from-drafter {SERVING_DRAFTER} is another drafter than this job trains: block_size 5 (this " \
           "job: 3)" in capsys.readouterr().err
    assert main(fine_tune_argv(tmp_path / "o", tmp_path / "capture", "--drafter", "dflash")) == 2
    assert "kind 'dspark' (this job: 'dflash')" in capsys.readouterr().err


def test_without_a_kind_or_a_capture_file_train_refuses_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("dspark.models.training.run.target_and_drafter", no_model_before_the_checks)
    capture_folder(tmp_path / "capture", files=1, records=8)
    assert main(["train", "--target", str(EMBEDDED_TARGET), "--out", str(tmp_path / "o"), "--data",
                 str(tmp_path / "capture")]) == 2
    assert "--drafter is required (dspark, dflash or eagle3), unless --init-from-drafter DIR gives it" in \
        capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    assert main(fine_tune_argv(tmp_path / "o", tmp_path / "empty")) == 2
    assert f"--data {tmp_path / 'empty'}: the folder holds no *.jsonl file" in capsys.readouterr().err


def test_a_bad_record_in_any_capture_file_is_refused_naming_its_file_and_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("dspark.models.training.run.target_and_drafter", no_model_before_the_checks)
    capture_folder(tmp_path / "capture", files=2, records=4)
    second = sorted((tmp_path / "capture").glob("*.jsonl"))[1]
    second.write_text(second.read_text() + '{"index": 9, "messages": "not a list"}\n')
    assert main(fine_tune_argv(tmp_path / "o", tmp_path / "capture")) == 2
    assert f"{second}:5" in capsys.readouterr().err
