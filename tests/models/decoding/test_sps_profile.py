"""`dspark profile-sps` measures the embedded target and writes a table SGLang and our allocator read."""
import json

import pytest

from dspark.models.decoding.sps_profile import (MAX_TABLE_BYTES, load_sps, probe_shape, probe_sizes,
                                                profile_sps)
from dspark.models.errors import ConfigError
from dspark.ops.cli import main
from tests.paths import EMBEDDED_TARGET


@pytest.mark.parametrize("tokens, per_request, expected", [(1, 7, [1]), (7, 7, [7]), (16, 7, [8, 8]), (22, 7, [8, 7, 7]),
                                                           (20, 4, [4] * 5)])
def test_probe_shapes_spread_tokens_over_requests(tokens, per_request, expected):
    assert probe_shape(tokens, per_request).tolist() == expected


def test_profile_measures_each_probe(embedded_target):
    table, records = profile_sps(embedded_target, (1, 8, 24), context_len=16, warmup=1, repeats=2, progress=False)
    assert table.sample_batch_tokens == (1, 8, 24) and table.max_batch_tokens == 24
    assert [r["requests"] for r in records] == [1, 1, 3]
    assert all(0 < r["min_s"] <= r["median_s"] <= r["max_s"] for r in records)
    fastest = [r["min_s"] for r in records]
    assert table.sample_steps_per_sec == (1 / min(fastest), 1 / min(fastest[1:]), 1 / fastest[2])  # bound from above


def test_a_slow_probe_is_bounded_by_the_bigger_ones_and_passes_nothing_on(embedded_target, monkeypatch):
    """Noise only slows a forward: a probe slower than a bigger one takes the bigger one's time, and the sizes
    above it keep their own."""
    from dspark.models.decoding import sps_profile
    seconds = {1: 0.010, 2: 0.050, 3: 0.020, 4: 0.030}  # the 2-token probe ran in a slow moment
    monkeypatch.setattr(sps_profile.Probe, "seconds", lambda probe: seconds[int(probe.new_valid.sum())])
    table, records = profile_sps(embedded_target, (1, 2, 3, 4), context_len=4, warmup=0, repeats=2, progress=False)
    assert [r["min_s"] for r in records] == [0.010, 0.050, 0.020, 0.030]
    assert [round(1 / s, 6) for s in table.sample_steps_per_sec] == [0.010, 0.020, 0.020, 0.030]


def test_passes_interleave_the_probes_and_repeat_over_the_same_cache(embedded_target):
    """Each pass runs every probe once, smallest first; every forward sees only its probe's context."""
    from dspark.models.decoding.target import TargetRunner
    seen = []
    original = TargetRunner.forward

    def spy(self, tokens, new_valid, **kwargs):
        seen.append((int(new_valid.sum()), self.valid.shape[1]))
        return original(self, tokens, new_valid, **kwargs)

    TargetRunner.forward = spy
    try:
        profile_sps(embedded_target, (3, 1), context_len=10, warmup=1, repeats=2, progress=False)
    finally:
        TargetRunner.forward = original
    assert seen == [(10, 0), (10, 0)] + [(1, 10), (3, 10)] * 3  # two prefills, then warm-up + repeats


def test_cli_writes_table_and_plot(tmp_path, capsys):
    out = tmp_path / "sps.json"
    assert main(["profile-sps", "--target", str(EMBEDDED_TARGET), "--out", str(out), "--batch-tokens", "1", "4",
                 "--context-len", "8", "--repeats", "1", "--warmup", "0", "--threads", "1"]) == 0
    assert load_sps(out).sample_batch_tokens == (1, 4)
    assert set(json.loads(out.read_text())) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    assert out.with_suffix(".png").stat().st_size > 0
    assert "tokens/s" in capsys.readouterr().out


def test_bad_probe_settings_are_named(embedded_target):
    with pytest.raises(ConfigError, match="distinct positive"):
        profile_sps(embedded_target, (4, 4))
    with pytest.raises(ConfigError, match="repeats >= 1"):
        profile_sps(embedded_target, (4,), repeats=0)


def test_probes_every_size_of_one_block_then_powers_of_two():
    assert probe_sizes(28, 7) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 28]
    assert probe_sizes(4, 7) == [1, 2, 3, 4]


SECRET = "do-not-echo-4f2a"  # content a refused table must not leak into the message


@pytest.mark.parametrize("name, content, kind", [
    ("binary.json", b"\x89PNG\r\n\x1a\n\xff\xfe" + SECRET.encode(), "UnicodeDecodeError"),
    ("syntax.json", f'{{"sample_batch_tokens": [1, 2], "{SECRET}": '.encode(), "JSONDecodeError"),
    ("fields.json", json.dumps({SECRET: 1}).encode(), "KeyError"),
    ("values.json", json.dumps({"sample_batch_tokens": [4, 1], "sample_steps_per_sec": [1.0, 2.0],
                                "max_batch_tokens": SECRET}).encode(), "ValueError"),
    ("values.json", json.dumps({"sample_batch_tokens": [4, 1], "sample_steps_per_sec": [1.0, 2.0],
                                "max_batch_tokens": 8}).encode(), "ValueError"),  # the table's own rule
    ("deep.json", b"[" * 100_000, "RecursionError"),
    ("big.json", b" " * (MAX_TABLE_BYTES + 1), "over 1048576 bytes"),
])
def test_every_failure_to_read_a_table_is_a_config_error_that_quotes_nothing_of_it(tmp_path, name, content, kind):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        load_sps(path)
    message = str(refused.value)
    assert kind in message and str(path) in message
    assert SECRET not in message and "line 1" not in message and "[4, 1]" not in message


@pytest.mark.parametrize("path, problem", [
    ("/" + "a" * 256, "cannot be read: File name too long"),  # ENAMETOOLONG from the file system
    ("/", "does not exist or is not a file"),
    ("/tmp/\0x", "does not exist or is not a file"),  # a NUL byte
])
def test_unreadable_paths_are_config_errors(path, problem):
    with pytest.raises(ConfigError, match=problem):
        load_sps(path)
