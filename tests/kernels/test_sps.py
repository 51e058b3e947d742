"""SpsTable reads, writes and looks up exactly like SGLang 0.5.23's SpsCostTable."""
import json

import pytest
import torch
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable, load_sps_table_from_path

from dspark.kernels.sps import SpsTable
from dspark.models.decoding.sps_profile import load_sps
from dspark.models.errors import ConfigError

TABLE = SpsTable((1, 4, 8, 32), (40.0, 38.5, 30.0, 12.0), 64)


def test_lookup_matches_sglang_floor_rule():
    theirs = SpsCostTable(sample_batch_tokens=[1, 4, 8, 32], sample_steps_per_sec=[40.0, 38.5, 30.0, 12.0],
                          max_batch_tokens=64)
    sizes = torch.arange(0, 80)
    assert TABLE.lookup(sizes).tolist() == [theirs.lookup(int(b)) for b in sizes]


def test_json_round_trip_is_sglang_readable(tmp_path):
    path = tmp_path / "sps.json"
    TABLE.save(path)
    assert load_sps(path) == TABLE
    theirs = load_sps_table_from_path(str(path))
    assert isinstance(theirs, SpsCostTable) and theirs.sample_batch_tokens == [1, 4, 8, 32]
    assert theirs.max_batch_tokens == 64


@pytest.mark.parametrize("payload, message", [
    ({"sample_batch_tokens": [], "sample_steps_per_sec": [], "max_batch_tokens": 8}, "empty"),
    ({"sample_batch_tokens": [1, 8, 4], "sample_steps_per_sec": [3, 2, 1], "max_batch_tokens": 8},
     "strictly increasing"),
    ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3], "max_batch_tokens": 8}, "2 sample_batch_tokens but 1"),
    ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3, 0], "max_batch_tokens": 8}, r"finite and > 0"),
    ({"sample_batch_tokens": [1, 16], "sample_steps_per_sec": [3, 2], "max_batch_tokens": 8}, "below its largest"),
])
def test_bad_tables_are_named(tmp_path, payload, message):
    """The table says what is wrong with it; a file read for a live update says only that it is not a table (the
    reason would describe a file on the server to whoever named it)."""
    with pytest.raises(ValueError, match=message):
        SpsTable(tuple(payload["sample_batch_tokens"]), tuple(payload["sample_steps_per_sec"]),
                 payload["max_batch_tokens"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ConfigError, match=r"is not an SpsCostTable JSON \(ValueError\)") as refused:
        load_sps(path)
    assert str(payload["sample_batch_tokens"]) not in str(refused.value)


def test_a_file_without_the_fields_is_not_a_table(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"sample_batch_tokens": [1, 2]}))
    with pytest.raises(ConfigError, match="not an SpsCostTable JSON"):
        load_sps(path)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_sps(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ConfigError, match="JSONDecodeError"):
        load_sps(tmp_path / "x.json")


def test_overhead_adds_to_every_step():
    table = SpsTable((1, 8), (100.0, 50.0), 8)  # 10 ms and 20 ms per forward
    slower = table.with_overhead(0.03)
    assert slower.sample_steps_per_sec == pytest.approx((1 / 0.04, 1 / 0.05))
    assert table.with_overhead(0.0) == table
    with pytest.raises(ValueError, match="overhead"):
        table.with_overhead(-0.01)
