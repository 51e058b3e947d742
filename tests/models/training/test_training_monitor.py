"""The run monitor: logged terms land in TensorBoard event files, the periodic held-out check keeps the best
drafter's weights, and its state survives a checkpoint."""
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dspark.models.training.monitor import RunMonitor


def scalars(work_dir, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(work_dir / "tensorboard"))
    events.Reload()
    return [(e.step, round(e.value, 4)) for e in events.Scalars(tag)]


def test_terms_and_held_out_tau_are_event_files_and_the_best_drafter_is_kept(tmp_path):
    drafter = torch.nn.Linear(2, 2)
    taus = iter([0.5, 0.9, 0.7])
    monitor = RunMonitor(tmp_path, evaluate=lambda: {"tau": (tau := next(taus)), "decoded_tau": tau + 1}, eval_every=2)
    monitor.start(0)
    weights_at = {}
    for step in range(1, 7):
        with torch.no_grad():
            drafter.weight.add_(1.0)  # a training step
        weights_at[step] = drafter.weight.clone()
        monitor.log({"step": step, "loss": 1.0 / step})
        monitor.after_step(step, drafter)
    monitor.close()
    assert scalars(tmp_path, "train/loss") == [(s, round(1.0 / s, 4)) for s in range(1, 7)]
    assert scalars(tmp_path, "heldout/tau") == [(2, 0.5), (4, 0.9), (6, 0.7)]
    assert scalars(tmp_path, "heldout/decoded_tau") == [(2, 1.5), (4, 1.9), (6, 1.7)]
    assert monitor.best == {"step": 4, "tau": 0.9, "decoded_tau": 1.9}, "the best by teacher-forced tau"
    assert monitor.load_best(drafter) and torch.equal(drafter.weight, weights_at[4])
    resumed = RunMonitor(tmp_path, evaluate=lambda: {"tau": 0.0}, eval_every=2)
    resumed.load_state_dict(monitor.state_dict())
    assert resumed.best == monitor.best and len(resumed.evaluations) == 3


def test_without_evaluations_there_is_no_best(tmp_path):
    monitor = RunMonitor(tmp_path)
    monitor.start(0)
    monitor.after_step(5, torch.nn.Linear(2, 2))
    monitor.close()
    assert monitor.best is None and not monitor.load_best(torch.nn.Linear(2, 2))


def test_a_monitor_that_does_not_write_evaluates_and_tracks_the_best_alone(tmp_path):
    """Another rank's monitor beside rank 0's when the check runs a sharded target: the same checks, no files."""
    taus = iter([0.5, 0.9])
    monitor = RunMonitor(tmp_path, evaluate=lambda: {"tau": next(taus)}, eval_every=1, writes=False)
    monitor.start(0)
    for step in (1, 2):
        monitor.log({"step": step, "loss": 1.0})
        monitor.after_step(step, torch.nn.Linear(2, 2))
    monitor.close()
    assert [e["tau"] for e in monitor.evaluations] == [0.5, 0.9] and monitor.best == {"step": 2, "tau": 0.9}
    assert list(tmp_path.iterdir()) == [], "rank 0 writes the event files and the best weights"


def test_a_check_whose_tau_is_not_finite_is_never_the_best(tmp_path):
    taus = iter([float("nan"), 0.5, float("inf"), 0.4])
    monitor = RunMonitor(tmp_path, evaluate=lambda: {"tau": next(taus)}, eval_every=1, writes=False)
    for step in (1, 2, 3, 4):
        monitor.after_step(step, torch.nn.Linear(2, 2))
    assert monitor.best == {"step": 2, "tau": 0.5}
