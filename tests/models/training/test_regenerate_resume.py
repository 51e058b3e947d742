"""The regenerated file a killed run leaves is resumed without duplicates, and never mixed across settings."""
import json
from dataclasses import asdict

import pytest

from dspark.models.errors import ConfigError
from dspark.models.training.regenerate import ReplySampling, done_indices, read_regenerated
from dspark.ops.cli import main

SAMPLING = asdict(ReplySampling())


def record(index: int, sampling=SAMPLING) -> str:
    messages = [{"role": "user", "content": f"q{index}"}, {"role": "assistant", "content": f"a{index}"}]
    return json.dumps({"index": index, "messages": messages, "reply_tokens": 1, "sampling": sampling}) + "\n"


def test_a_cut_last_line_is_dropped_and_the_file_stays_appendable(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(record(3) + record(0) + record(1)[:20])
    assert done_indices(out, 4, SAMPLING) == {0, 3}
    assert out.read_text() == record(3) + record(0), "the cut line is gone, the complete ones stay"
    with out.open("a") as sink:
        sink.write(record(1))
    conversations = read_regenerated(out)
    assert [c.messages[0]["content"] for c in conversations] == ["q0", "q1", "q3"], "read back in input order"
    assert [c.where for c in conversations] == [f"{out}:2", f"{out}:3", f"{out}:1"], "each named by its line"


@pytest.mark.parametrize("lines, message", [
    ([record(0), record(0)], "has index 0"),
    ([record(9)], "has index 9"),
    ([record(0).replace('"index": 0', '"index": true')], "has index True"),
    ([record(0, {**SAMPLING, "temperature": 0.0})], "sampled with"),
    (["{}\n"], "not a regenerated record"),
    (["line one\n", "important last line"], ":1: not valid JSON"),
    (["important notes, no newline"], ":1 is not a regenerated record"),
    ([record(0), "important last line"], ":2 is not a regenerated record"),
    (["[" * 100_000 + "\n"], ":1: not JSON this reader takes"),
])
def test_a_file_that_is_not_this_run_s_is_refused_and_left_as_it_was(tmp_path, lines, message):
    out = tmp_path / "out.jsonl"
    out.write_text("".join(lines))
    with pytest.raises(ConfigError, match=message):
        done_indices(out, 4, SAMPLING)
    assert out.read_text() == "".join(lines)


def test_an_out_that_is_not_utf8_or_not_a_file_is_refused_by_name(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(record(0).encode() + b"\xff\n")
    with pytest.raises(ConfigError, match=r"out.jsonl:2: not UTF-8 \(byte 0\)"):
        done_indices(out, 4, SAMPLING)
    with pytest.raises(ConfigError, match="is not a file"):
        done_indices(tmp_path, 4, SAMPLING)


def test_a_repeated_index_is_not_trained_twice(tmp_path):
    data = tmp_path / "regen.jsonl"
    data.write_text(record(0) + record(1) + record(0))
    with pytest.raises(ConfigError, match="regen.jsonl:3: index 0 again"):
        read_regenerated(data)


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", -1),
                                          ("max_new_tokens", 0)])
def test_sampling_bounds_name_the_flag(field, value):
    with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} must be in"):
        ReplySampling(**{field: value})


@pytest.mark.parametrize("flags, message", [
    (["--endpoint", "http://127.0.0.1:1", "--device", "cpu"], "--device is where --target's Engine runs"),
    (["--target", "embedded/target", "--model", "m"], "--api-key-file and --model are read with --endpoint only"),
    (["--endpoint", "http://127.0.0.1:1", "--concurrency", "0"], "--concurrency must be in [1, 4096], got 0"),
    (["--target", "/nonexistent", "--concurrency", "0"], "--concurrency must be in [1, 4096], got 0"),
    (["--endpoint", "http://127.0.0.1:1", "--api-key-file", "/nonexistent/key"],
     "--api-key-file /nonexistent/key does not exist"),
    (["--endpoint", "http://127.0.0.1:1", "--top-p", "0"], "--top-p must be in (0, 1], got 0"),
    (["--target", "/nonexistent"], "--target /nonexistent is not a model directory"),
])
def test_the_command_refuses_flags_that_do_not_fit(tmp_path, capsys, flags, message):
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "def f("}\n')
    assert main(["regenerate", "--input", str(source), "--out", str(tmp_path / "out.jsonl"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_bad_out_is_refused_before_an_engine_starts(tmp_path, capsys):
    source, out = tmp_path / "in.jsonl", tmp_path / "notes.txt"
    source.write_text('{"prompt": "def f("}\n')
    out.write_text("my notes\n")
    assert main(["regenerate", "--input", str(source), "--out", str(out), "--target", "/nonexistent"]) == 2
    assert f"{out}:1: not valid JSON" in capsys.readouterr().err and out.read_text() == "my notes\n"
