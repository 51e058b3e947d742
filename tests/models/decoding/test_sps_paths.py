"""Which SPS table paths a live update may name (models/decoding/sps_paths.py): under the SPS directories, or
the table the server started with; the shape of a path is checked before anything resolves it."""
import os

import pytest

from dspark.models.decoding.sps_paths import SPS_DIR_ENV, confined_sps_path, sps_dirs, sps_write_dir
from dspark.models.errors import ConfigError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(SPS_DIR_ENV, raising=False)
    (tmp_path / "cache" / "sps" / "refit").mkdir(parents=True)
    return tmp_path


def test_the_default_directory_is_under_the_cache_and_paths_under_it_pass(cache):
    assert sps_dirs() == [cache / "cache" / "sps"] and sps_write_dir() == cache / "cache" / "sps"
    inside = str(cache / "cache" / "sps" / "refit" / "t.json")
    assert confined_sps_path(inside) == inside  # passed on as given, whether or not it exists yet


@pytest.mark.parametrize("name", ["../elsewhere.json", "refit/../../escape.json"])
def test_dot_dot_cannot_leave_the_directory(cache, name):
    with pytest.raises(ConfigError, match="sps_table must name a table under"):
        confined_sps_path(str(cache / "cache" / "sps" / name))


def test_a_symlink_inside_that_points_outside_is_refused(cache):
    (cache / "outside.json").write_text("{}")
    link = cache / "cache" / "sps" / "link.json"
    link.symlink_to(cache / "outside.json")
    with pytest.raises(ConfigError, match="must name a table under"):
        confined_sps_path(str(link))


def test_the_table_the_server_started_with_stays_allowed(cache):
    started = str(cache / "etc" / "sps.json")
    assert confined_sps_path(started, started_with=started) == started
    with pytest.raises(ConfigError, match="must name a table under"):
        confined_sps_path(str(cache / "etc" / "other.json"), started_with=started)


@pytest.mark.parametrize("value", ["/" + "a" * 256, "/" + "a/" * 2100, "/tmp/a\0b"])
def test_overlong_or_nul_paths_are_refused_by_shape_naming_the_bound(cache, value):
    with pytest.raises(ConfigError) as refused:
        confined_sps_path(value)
    message = str(refused.value)
    assert message.startswith("sps_table must be a path without NUL of at most 4096 bytes and 255 per component")
    assert len(message) < 400  # the value is clipped, with its length


def test_the_refusal_names_field_bound_and_a_clipped_value(cache):
    with pytest.raises(ConfigError) as refused:
        confined_sps_path("/etc/" + "x" * 250)
    message = str(refused.value)
    assert str(cache / "cache" / "sps") in message and "$DSPARK_SPS_DIR" in message
    assert "xxx... (257 chars)" in message and len(message) < 500  # the repr, quotes included


def test_the_environment_lists_several_directories_and_the_first_is_written(cache, monkeypatch):
    first, mounted = cache / "w", cache / "mounted"
    monkeypatch.setenv(SPS_DIR_ENV, f"{first}{os.pathsep}{mounted}")
    assert sps_write_dir() == first
    assert confined_sps_path(str(mounted / "sps.json")) == str(mounted / "sps.json")
    with pytest.raises(ConfigError, match="must name a table under"):
        confined_sps_path(str(cache / "cache" / "sps" / "t.json"))  # the default no longer applies
