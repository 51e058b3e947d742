"""Where SGLang's schedulers find the SPS table they measured on an earlier start (integration/sps_forward.py)."""
import os
import shutil

from dspark.integration.sps_forward import cache_name, cached_copies, content_revision
from dspark.models.decoding.sps_paths import SPS_DIR_ENV
from tests.paths import EMBEDDED_TARGET

KEY = {"model": "/models/target", "revision": "abc", "device": "NVIDIA H100", "dtype": "torch.bfloat16",
       "tp_size": 1, "attention_backend": "FlashInferAttnBackend"}


def test_a_copy_of_the_same_model_files_has_the_same_revision_whatever_its_timestamps(tmp_path):
    copy = shutil.copytree(EMBEDDED_TARGET, tmp_path / "copy")
    os.utime(copy / "config.json", (0, 0))  # another pod's download: other mtimes
    assert content_revision(copy) == content_revision(EMBEDDED_TARGET)
    with (copy / "model.safetensors").open("ab") as weights:
        weights.write(b"\0")  # other weights
    assert content_revision(copy) != content_revision(EMBEDDED_TARGET)


def test_every_sps_directory_is_searched_in_order_and_the_key_names_the_file(tmp_path, monkeypatch):
    writable, job_tables = tmp_path / "cache", tmp_path / "configmap"
    monkeypatch.setenv(SPS_DIR_ENV, f"{writable}{os.pathsep}{job_tables}")
    name = cache_name(KEY)
    assert cached_copies(KEY) == [writable / "sglang" / name, job_tables / "sglang" / name]
    assert name.startswith("target-") and cache_name({**KEY, "tp_size": 2}) != name
