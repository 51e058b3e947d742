"""Trainer: LR schedule, loss goes down, checkpoint/resume is exact, time budget, data-parallel equivalence."""
import math
import shutil

import pytest
import torch
from training_helpers import EOS_ID, make_drafter_and_task

from dspark.models.errors import CheckpointError, ConfigError
from dspark.models.training.data import DataConfig, build_dataset
from dspark.models.training.trainer import DistContext, TrainConfig, Trainer, batch_indices, lr_factor


@pytest.fixture(scope="module")
def tiny_dataset(peaked_target, tiny_documents):
    cfg = DataConfig(num_samples=16, prompt_len=8, response_len=16, generation_batch_size=16, seed=0)
    return build_dataset(tiny_documents, cfg, peaked_target, EOS_ID, progress=False)


def test_lr_schedule_warmup_then_cosine_to_zero():
    factors = [lr_factor(s, 100, 0.04) for s in range(100)]
    assert factors[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert all(a >= b for a, b in zip(factors[4:], factors[5:])), "non-increasing after warmup"
    assert factors[52] == pytest.approx(0.5, abs=1e-9)  # half-way through the 96 cosine steps
    assert factors[99] == pytest.approx(0.5 * (1 + math.cos(math.pi * 95 / 96)))
    assert lr_factor(100, 100, 0.04) == 0.0
    assert lr_factor(0, 10, 0.0) == 1.0, "no warmup: starts at the peak"


def test_batches_cover_each_epoch_once_and_split_by_rank():
    cfg = TrainConfig(batch_size=2, seed=5)
    ranks = [DistContext(rank=r, world_size=2) for r in range(2)]
    epoch0 = torch.cat([batch_indices(9, cfg, d, i) for i in range(2) for d in ranks])
    assert len(set(epoch0.tolist())) == 8, "one epoch = 2 global batches of 4 distinct samples"
    assert not torch.equal(batch_indices(9, cfg, ranks[0], 0), batch_indices(9, cfg, ranks[0], 2)), "reshuffled"


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_few_steps_decrease_loss(kind, peaked_target, tiny_dataset, tmp_path):
    drafter, task = make_drafter_and_task(kind, peaked_target)
    cfg = TrainConfig(steps=40, lr=1e-2, batch_size=8, log_every=5, warmup_frac=0.1)
    trainer = Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path, progress=False)
    result = trainer.run()
    losses = [row["loss"] for row in trainer.history]
    assert result.steps == 40 and not result.stopped_early
    assert losses[-1] < 0.8 * losses[0], losses
    assert (tmp_path / "train_log.json").exists()


def test_resume_continues_identically(peaked_target, tiny_dataset, tmp_path):
    cfg = TrainConfig(steps=6, lr=5e-3, batch_size=4, grad_accum=2, checkpoint_every=3, log_every=1)
    drafter, task = make_drafter_and_task("dspark", peaked_target)
    straight = Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path / "a", progress=False)
    straight.run()

    resumed_dir = tmp_path / "b" / "checkpoints"
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step_0000003", resumed_dir / "step_0000003")
    (resumed_dir / "latest").write_text("step_0000003\n")
    fresh, _ = make_drafter_and_task("dspark", peaked_target)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # the resumed weights must come from the checkpoint
    resumed = Trainer(fresh, peaked_target, tiny_dataset, task, cfg, tmp_path / "b", progress=False)
    assert resumed.resume() and resumed.step == 3
    resumed.run()
    for (name, a), b in zip(drafter.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    drop_time = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert drop_time(straight.history) == drop_time(resumed.history)


def test_resume_refuses_a_different_schedule(peaked_target, tiny_dataset, tmp_path):
    drafter, task = make_drafter_and_task("dflash", peaked_target)
    def trainer(steps):
        cfg = TrainConfig(steps=steps, batch_size=4)
        return Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path, progress=False)

    trainer(2).run()
    other = trainer(5)
    with pytest.raises(CheckpointError, match="steps=2"):
        other.resume()


class RunsCode:
    def __reduce__(self):
        return (print, ("code ran on resume",))


def _edited_state(ckpt, **changes):
    path = ckpt / "step_0000002" / "trainer_state.pt"
    torch.save({**torch.load(path, weights_only=True), **changes}, path)


def _latest_a_directory(ckpt):
    (ckpt / "latest").unlink()
    (ckpt / "latest").mkdir()


@pytest.mark.parametrize("damage, message", [
    (lambda ckpt: (ckpt / "latest").write_text("../../elsewhere\n"), "not a step_NNNNNNN folder"),
    (_latest_a_directory, "latest is not a regular file"),
    (lambda ckpt: _edited_state(ckpt, step="2"), r"\(step of the wrong kind\)"),
    (lambda ckpt: _edited_state(ckpt, torch_rng=[1, 2], wall_s=float("nan")),
     r"\(torch_rng, wall_s of the wrong kind\)"),
    (lambda ckpt: _edited_state(ckpt, train_config=["steps"]), r"\(train_config of the wrong kind\)"),
    (lambda ckpt: torch.save({"x": RunsCode()}, ckpt / "step_0000002" / "trainer_state.pt"),
     "cannot be read as a resume state"),
    (lambda ckpt: (ckpt / "step_0000002" / "trainer_state.pt").write_bytes(b"PK\x03\x04 cut"),
     "cannot be read as a resume state"),
    (lambda ckpt: torch.save({"step": 2}, ckpt / "step_0000002" / "trainer_state.pt"), "it lacks"),
])
def test_resume_refuses_a_damaged_or_foreign_state_and_runs_no_code_from_it(peaked_target, tiny_dataset, tmp_path,
                                                                           capsys, damage, message):
    drafter, task = make_drafter_and_task("dflash", peaked_target)
    trainer = lambda: Trainer(drafter, peaked_target, tiny_dataset, task,  # noqa: E731
                              TrainConfig(steps=2, batch_size=4), tmp_path, progress=False)
    trainer().run()
    damage(tmp_path / "checkpoints")
    with pytest.raises(CheckpointError, match=message):
        trainer().resume()
    assert "code ran on resume" not in capsys.readouterr().out


def test_resume_refuses_another_drafter_shape(peaked_target, tiny_dataset, tmp_path):
    cfg = TrainConfig(steps=2, batch_size=4)
    drafter, task = make_drafter_and_task("dflash", peaked_target)
    Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path, progress=False).run()
    other, other_task = make_drafter_and_task("dspark", peaked_target)
    with pytest.raises(CheckpointError, match="holds another drafter's state"):
        Trainer(other, peaked_target, tiny_dataset, other_task, cfg, tmp_path, progress=False).resume()


def test_only_the_newest_checkpoints_are_kept_and_never_the_latest_deleted(peaked_target, tiny_dataset, tmp_path):
    drafter, task = make_drafter_and_task("dflash", peaked_target)
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "step_0000009").mkdir(parents=True)  # a stray newer folder (say, a copy) sorts after every step
    (checkpoints / "notes").mkdir()  # not a step folder: never touched
    cfg = TrainConfig(steps=5, batch_size=4, checkpoint_every=1, keep_checkpoints=2)
    Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path, progress=False).run()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "notes", "step_0000005", "step_0000009"]
    assert (checkpoints / "latest").read_text().strip() == "step_0000005"
    with pytest.raises(ConfigError, match="keep_checkpoints must be >= 1, got 0"):
        TrainConfig(keep_checkpoints=0)


def test_time_budget_stops_early_and_checkpoints(peaked_target, tiny_dataset, tmp_path):
    drafter, task = make_drafter_and_task("dflash", peaked_target)
    cfg = TrainConfig(steps=1000, batch_size=4, max_minutes=1e-6)
    result = Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path, progress=False).run()
    assert result.stopped_early and result.steps == 1
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_0000001"


@pytest.mark.slow
def test_data_parallel_equals_one_process_with_the_global_batch(tmp_path):
    """2 gloo ranks x batch 2 == 1 process x batch 4 (Eagle3 has no sampling, so the runs are comparable)."""
    from training_helpers import ddp_setup, ddp_worker

    out_file = str(tmp_path / "ddp_state.pt")
    torch.multiprocessing.spawn(ddp_worker, args=(2, str(tmp_path / "rdv"), out_file, 3, 2), nprocs=2)
    target, dataset = ddp_setup()
    drafter, task = make_drafter_and_task("eagle3", target)
    cfg = TrainConfig(steps=3, batch_size=4, lr=5e-3)
    single = Trainer(drafter, target, dataset, task, cfg, tmp_path / "single", progress=False)
    single.run()
    ddp = torch.load(out_file)
    for name, value in drafter.state_dict().items():
        assert torch.allclose(value, ddp["state"][name], atol=1e-5), name
    for one, two in zip(single.history, ddp["history"]):  # logged terms are global sums; gradients are not halved
        for key in ("loss", "accept", "grad_norm"):
            assert one[key] == pytest.approx(two[key], rel=1e-4), key


def test_bf16_autocast_trains(peaked_target, tiny_dataset, tmp_path):
    drafter, task = make_drafter_and_task("dspark", peaked_target)
    cfg = TrainConfig(steps=3, batch_size=4, bf16=True, log_every=1)
    trainer = Trainer(drafter, peaked_target, tiny_dataset, task, cfg, tmp_path, progress=False)
    trainer.run()
    assert all(math.isfinite(row["loss"]) for row in trainer.history)
    assert all(p.dtype == torch.float32 for p in drafter.parameters()), "master weights stay fp32"
