"""Feature store: the stored target outputs equal a target forward, shards are bf16 and memory-mapped, a killed
writer resumes, a store is keyed, and training on it matches online training."""
import json
import os

import pytest
import torch
from training_helpers import EOS_ID, make_drafter_and_task

from dspark.models.errors import ConfigError
from dspark.models.training.data import DataConfig, build_dataset
from dspark.models.training.feature_cache import OnlineFeatures
from dspark.models.training.feature_store import (StoreLayout, describe_size, forwards_left, open_store,
                                                  store_directory, write_shard)
from dspark.models.training.trainer import TrainConfig, Trainer

LAYER_IDS = (0, 1, 2)
KEY = {"data": "x", "target_layer_ids": list(LAYER_IDS)}


@pytest.fixture(scope="module")
def padded_dataset(peaked_target, tiny_documents):
    # Responses end at a generated EOS now and then: rows of different real lengths with right padding.
    cfg = DataConfig(num_samples=12, prompt_len=6, response_len=14, generation_batch_size=12, seed=3)
    return build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False)


def layout_of(target, dataset, shards: int) -> StoreLayout:
    hidden = target.config.hidden_size
    return StoreLayout(len(dataset), dataset.input_ids.shape[1], len(LAYER_IDS) * hidden, hidden, shards)


def stored(target, dataset, directory, shards=1, key=KEY):
    layout = layout_of(target, dataset, shards)
    for shard in range(shards):  # what each rank of a `shards`-process run writes
        write_shard(directory, key, layout, shard, target, dataset, LAYER_IDS, batch_size=5, progress=False)
    return open_store(directory, key, layout, target.get_output_embeddings())


@pytest.mark.parametrize("shards", [1, 3])
def test_stored_outputs_equal_a_target_forward_where_attended(peaked_target, padded_dataset, tmp_path, shards):
    features = stored(peaked_target, padded_dataset, tmp_path / "store", shards)
    index = torch.tensor([7, 0, 11, 4])
    batch = padded_dataset.select(index)
    online = OnlineFeatures(peaked_target, LAYER_IDS)(index, batch)
    offline = features(index, batch)
    seen = batch.attention_mask
    assert torch.allclose(offline.hidden[seen], online.hidden[seen], rtol=1e-2, atol=1e-2), "bf16 storage"
    assert torch.allclose(offline.logits()[seen], online.logits()[seen], rtol=2e-2, atol=2e-2)
    assert (offline.hidden[~seen] == 0).all(), "padding holds zeros, not stale values"


def test_shards_are_raw_bf16_of_the_size_printed_first(peaked_target, padded_dataset, tmp_path, capsys):
    layout = layout_of(peaked_target, padded_dataset, 2)
    write_shard(tmp_path, KEY, layout, 0, peaked_target, padded_dataset, LAYER_IDS)
    out = capsys.readouterr()
    assert out.out.startswith(describe_size(layout, tmp_path)), "the expected size comes before any row"
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("shard-00000.*.bf16"))
    assert on_disk == len(layout.rows(0)) * layout.bytes_per_sample
    assert open_store(tmp_path, KEY, layout, peaked_target.get_output_embeddings()) is None, "shard 1 is missing"


def test_a_killed_writer_resumes_after_its_last_recorded_row(peaked_target, padded_dataset, tmp_path):
    layout = layout_of(peaked_target, padded_dataset, 1)
    counted = {"forwards": 0}

    def dying_forward(module, args, kwargs):
        counted["forwards"] += 1
        if counted["forwards"] == 3:
            raise KeyboardInterrupt  # the writer is stopped while computing its third batch
    hook = peaked_target.get_input_embeddings().register_forward_pre_hook(dying_forward, with_kwargs=True)
    with pytest.raises(KeyboardInterrupt):
        write_shard(tmp_path / "s", KEY, layout, 0, peaked_target, padded_dataset, LAYER_IDS, batch_size=4,
                    progress=False)
    hook.remove()
    assert (tmp_path / "s" / "shard-00000.progress.json").read_text().count('"rows": 8')
    resumed = stored(peaked_target, padded_dataset, tmp_path / "s")
    whole = stored(peaked_target, padded_dataset, tmp_path / "whole")
    index = torch.arange(12)
    batch = padded_dataset.select(index)
    assert torch.equal(resumed(index, batch).hidden, whole(index, batch).hidden)


def test_a_writer_runs_the_forwards_asked_of_it_in_step_with_other_ranks(peaked_target, padded_dataset, tmp_path):
    """With a sharded target every forward is a collective: a shard with fewer rows left runs extra forwards."""
    layout = layout_of(peaked_target, padded_dataset, 2)  # 6 rows a shard: 2 batches of 4
    assert forwards_left(tmp_path, layout, 0, batch_size=4) == 2
    calls = []
    hook = peaked_target.get_input_embeddings().register_forward_hook(lambda module, args, out: calls.append(1))
    write_shard(tmp_path, KEY, layout, 0, peaked_target, padded_dataset, LAYER_IDS, batch_size=4, progress=False,
                forwards=5)
    hook.remove()
    assert len(calls) == 5 and forwards_left(tmp_path, layout, 0, batch_size=4) == 0
    assert json.loads((tmp_path / "shard-00000.progress.json").read_text()) == {"rows": 6}, "extras write nothing"


def test_a_shard_file_that_is_a_link_is_refused_and_what_it_points_to_untouched(peaked_target, padded_dataset,
                                                                               tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "shard-00000.hidden.bf16").symlink_to(victim)
    with pytest.raises(ConfigError, match="shard .*shard-00000.hidden.bf16 cannot be written .* a regular file"):
        write_shard(tmp_path / "store", KEY, layout_of(peaked_target, padded_dataset, 1), 0, peaked_target,
                    padded_dataset, LAYER_IDS, progress=False)
    assert victim.read_bytes() == b"keep me"


def test_a_store_is_keyed_and_refuses_another_layout(peaked_target, padded_dataset, tmp_path):
    stored(peaked_target, padded_dataset, tmp_path, shards=2)
    lm_head = peaked_target.get_output_embeddings()
    one_rank = layout_of(peaked_target, padded_dataset, 1)
    assert open_store(tmp_path, KEY, one_rank, lm_head) is not None, "any rank count reads a complete store"
    assert open_store(tmp_path, {**KEY, "data": "y"}, one_rank, lm_head) is None, "another key never reads it"
    assert store_directory(tmp_path, KEY) != store_directory(tmp_path, {**KEY, "data": "y"})
    with pytest.raises(ConfigError, match="rerun with as many ranks as wrote it"):
        write_shard(tmp_path, KEY, layout_of(peaked_target, padded_dataset, 3), 0, peaked_target, padded_dataset,
                    LAYER_IDS, progress=False)


def _set_manifest_layout(store, **fields):
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["layout"].update(fields)
    (store / "manifest.json").write_text(json.dumps(manifest))


def _float_layout(store, name):
    manifest = json.loads((store / "manifest.json").read_text())
    _set_manifest_layout(store, **{name: float(manifest["layout"][name])})


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("damage, message", [
    (lambda store: (store / "manifest.json").write_text('{"key": '), "manifest .* cannot be read"),
    (lambda store: _fifo(store / "manifest.json"), "manifest .* is not a regular file"),
    (lambda store: _fifo(store / "shard-00001.progress.json"), "progress file .* is not a regular file"),
    (lambda store: _float_layout(store, "seq_len"), "holds layout .* for this run's key"),
    (lambda store: _set_manifest_layout(store, seq_len=3), "holds layout .* for this run's key"),
    (lambda store: _set_manifest_layout(store, shards=0), "holds layout .* for this run's key"),
    (lambda store: (store / "shard-00001.progress.json").write_text('{"rows": "4"}'), "records rows=4, not in"),
    (lambda store: (store / "shard-00001.progress.json").write_text('{"rows": -8}'), "records rows=-8, not in"),
    (lambda store: (store / "shard-00001.last.bf16").write_bytes(b"0" * 10), "holds 10 bytes, .* needed"),
    (lambda store: (store / "shard-00001.hidden.bf16").unlink(), "holds None bytes"),
])
def test_a_damaged_store_is_refused_by_name(peaked_target, padded_dataset, tmp_path, damage, message):
    stored(peaked_target, padded_dataset, tmp_path, shards=2)
    damage(tmp_path)
    with pytest.raises(ConfigError, match=message):
        open_store(tmp_path, KEY, layout_of(peaked_target, padded_dataset, 2), peaked_target.get_output_embeddings())


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_training_on_the_store_matches_online_training(kind, peaked_target, padded_dataset, tmp_path):
    cfg = TrainConfig(steps=4, lr=5e-3, batch_size=4, log_every=1)
    histories = []
    store = stored(peaked_target, padded_dataset, tmp_path / "store", shards=2)
    for name, features in (("online", None), ("stored", store)):
        drafter, task = make_drafter_and_task(kind, peaked_target)
        trainer = Trainer(drafter, peaked_target, padded_dataset, task, cfg, tmp_path / name, progress=False,
                          features=features)
        trainer.run()
        histories.append(trainer.history)
    for online, offline in zip(*histories):
        assert offline["loss"] == pytest.approx(online["loss"], rel=2e-2), "bf16 features, same training"
