"""`dspark profile-sps` measures the embedded target and writes a table SGLang and our allocator read."""
import json

import pytest
import torch

from dspark.models.decoding.sps_profile import load_sps, probe_shape, probe_sizes, profile_sps
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
    fastest = [1 / r["min_s"] for r in records]
    assert table.sample_steps_per_sec == (fastest[0], min(fastest[:2]), min(fastest))  # non-increasing envelope


def test_profile_leaves_no_state_between_repeats(embedded_target):
    """Every repeat runs against the same cache: the KV length after the probe equals the context."""
    from dspark.models.decoding import sps_profile
    seen = []
    original = sps_profile.TargetRunner.forward

    def spy(self, tokens, new_valid, **kwargs):
        seen.append(self.valid.shape[1])
        return original(self, tokens, new_valid, **kwargs)

    sps_profile.TargetRunner.forward = spy
    try:
        sps_profile.time_probe(embedded_target, torch.tensor([3, 2]), 10, 1, 3, torch.Generator())
    finally:
        sps_profile.TargetRunner.forward = original
    assert seen == [0, 10, 10, 10, 10]  # the prefill, then warm-up + repeats all over 10 cached slots


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
