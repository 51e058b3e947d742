"""Feature cache: the cached target outputs equal a target forward, round-trip on disk, and train identically."""
import pytest
import torch
from training_helpers import EOS_ID, make_drafter_and_task

from dspark.models.training.data import DataConfig, build_dataset
from dspark.models.training.feature_cache import (CachedFeatures, OnlineFeatures, compute_features,
                                                  feature_cache_path, load_features, save_features)
from dspark.models.training.trainer import TrainConfig, Trainer

LAYER_IDS = (0, 1, 2)


@pytest.fixture(scope="module")
def padded_dataset(peaked_target, tiny_documents):
    # Responses end at a generated EOS now and then: rows of different real lengths with right padding.
    cfg = DataConfig(num_samples=12, prompt_len=6, response_len=14, generation_batch_size=12, seed=3)
    return build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False)


def cached(target, dataset, dtype=torch.float32, batch_size=5) -> CachedFeatures:
    hidden, last = compute_features(target, dataset, LAYER_IDS, dtype, batch_size=batch_size, progress=False)
    return CachedFeatures(hidden, last, target.get_output_embeddings())


def test_cached_outputs_equal_a_target_forward_where_attended(peaked_target, padded_dataset):
    features = cached(peaked_target, padded_dataset)
    index = torch.tensor([7, 0, 11])
    batch = padded_dataset.select(index)
    online = OnlineFeatures(peaked_target, LAYER_IDS)(index, batch)
    offline = features(index, batch)
    seen = batch.attention_mask
    assert torch.allclose(offline.hidden[seen], online.hidden[seen], atol=1e-5)
    assert torch.allclose(offline.logits()[seen], online.logits()[seen], atol=1e-4)
    assert (offline.hidden[~seen] == 0).all(), "padding holds zeros, not stale values"


def test_logits_at_positions_are_those_rows_of_the_full_logits(peaked_target, padded_dataset):
    outputs = cached(peaked_target, padded_dataset)(torch.tensor([2, 5]), padded_dataset.select(torch.tensor([2, 5])))
    positions = torch.tensor([[0, 3, 3, 9], [7, 1, 12, 4]])
    full = outputs.logits()
    picked = outputs.logits(positions)
    assert picked.shape == (2, 4, full.shape[-1])
    assert torch.allclose(picked, torch.stack([full[0, positions[0]], full[1, positions[1]]]), atol=1e-5)


def test_bfloat16_storage_is_close(peaked_target, padded_dataset):
    exact, half = cached(peaked_target, padded_dataset), cached(peaked_target, padded_dataset, torch.bfloat16)
    assert half.hidden.dtype == torch.bfloat16
    assert torch.allclose(half.hidden.float(), exact.hidden, rtol=1e-2, atol=1e-2)


def test_disk_round_trip_is_keyed(peaked_target, padded_dataset, tmp_path):
    hidden, last = compute_features(peaked_target, padded_dataset, LAYER_IDS, progress=False)
    key = {"data": "x", "target_layer_ids": list(LAYER_IDS)}
    path = feature_cache_path(tmp_path, key)
    save_features(hidden, last, key, path)
    lm_head = peaked_target.get_output_embeddings()
    loaded = load_features(path, key, lm_head)
    assert torch.equal(loaded.hidden, hidden) and torch.equal(loaded.last_hidden, last)
    assert load_features(path, {**key, "data": "y"}, lm_head) is None, "another key never reads these features"
    assert feature_cache_path(tmp_path, {**key, "data": "y"}) != path


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_training_on_the_cache_matches_online_training(kind, peaked_target, padded_dataset, tmp_path):
    cfg = TrainConfig(steps=4, lr=5e-3, batch_size=4, log_every=1)
    histories = []
    for name, features in (("online", None), ("cached", cached(peaked_target, padded_dataset))):
        drafter, task = make_drafter_and_task(kind, peaked_target)
        trainer = Trainer(drafter, peaked_target, padded_dataset, task, cfg, tmp_path / name, progress=False,
                          features=features)
        trainer.run()
        histories.append(trainer.history)
    for online, offline in zip(*histories):
        assert offline["loss"] == pytest.approx(online["loss"], rel=1e-4)
