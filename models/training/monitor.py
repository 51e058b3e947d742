"""Watching a training run: its logged terms as TensorBoard scalars, and a periodic held-out τ with the best
drafter kept.

`RunMonitor` lives on rank 0. The other ranks get none, or, when the held-out check runs a target sharded over the
ranks (every rank must run its forwards), one that evaluates with rank 0 and writes nothing (`writes=False`).
Every logged window of the loss terms goes to TensorBoard event files in `<work>/tensorboard` (train/<term>;
`tensorboard --logdir <work>/tensorboard`), beside the JSON history the trainer writes (train_log.json). Every
`eval_every` steps it calls `evaluate`, which returns the held-out metrics ({"tau": the teacher-forced greedy τ,
"decoded_tau": the small decoded check}, models/training/evaluate.py), logs each as heldout/<name>, and when "tau"
beats every earlier one writes the drafter's weights to `<work>/best/drafter.pt` with `best.json` ({"step", and the
metrics}), so the export can take the best drafter rather than the last.

Its state (the evaluations so far, the best τ) travels in the trainer's checkpoint; after a resume the event
files are purged past the checkpoint's step, so steps a killed run logged after its last checkpoint are not
shown twice.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import torch

BEST_DIR = "best"
BEST_WEIGHTS = "drafter.pt"
BEST_INFO = "best.json"


class RunMonitor:
    def __init__(self, work_dir: Path, evaluate: Callable[[], dict[str, float]] | None = None,
                 eval_every: int = 0, writes: bool = True) -> None:
        if eval_every < 0 or (eval_every and evaluate is None):
            raise ValueError("eval_every must be >= 0, and > 0 only with an evaluate function")
        self.work_dir, self.evaluate, self.eval_every, self.writes = Path(work_dir), evaluate, eval_every, writes
        self.evaluations: list[dict] = []
        self.best: dict | None = None
        self._writer = None

    def start(self, step: int) -> None:
        """Open the event files at `step` (0, or the step a resumed run continues from)."""
        if not self.writes:
            return
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(self.work_dir / "tensorboard"), purge_step=step or None)

    def log(self, entry: dict[str, float]) -> None:
        """One window of logged terms (the trainer's history entry: step, wall_s, loss, ...)."""
        if not self.writes:
            return
        for name, value in entry.items():
            if name != "step":
                self._writer.add_scalar(f"train/{name}", value, entry["step"])
        self._writer.flush()

    def after_step(self, step: int, drafter: torch.nn.Module) -> None:
        if not self.eval_every or step % self.eval_every:
            return
        was_training = drafter.training
        drafter.eval()
        metrics = {name: float(value) for name, value in self.evaluate().items()}
        drafter.train(was_training)
        entry = {"step": step, **metrics}
        self.evaluations.append(entry)
        # a non-finite tau (a check that decoded nothing) is never the best: a NaN would block every later one
        is_best = math.isfinite(metrics["tau"]) and (self.best is None or metrics["tau"] > self.best["tau"])
        if is_best:
            self.best = entry
        if not self.writes:
            return
        for name, value in metrics.items():
            self._writer.add_scalar(f"heldout/{name}", value, step)
        self._writer.flush()
        if is_best:
            directory = self.work_dir / BEST_DIR
            directory.mkdir(parents=True, exist_ok=True)
            torch.save(drafter.state_dict(), directory / BEST_WEIGHTS)
            (directory / BEST_INFO).write_text(json.dumps(self.best) + "\n")

    def load_best(self, drafter: torch.nn.Module) -> bool:
        """Put the best drafter's weights into `drafter`; False when no evaluation ran."""
        if self.best is None:
            return False
        drafter.load_state_dict(torch.load(self.work_dir / BEST_DIR / BEST_WEIGHTS, weights_only=True))
        return True

    def state_dict(self) -> dict:
        return {"evaluations": self.evaluations, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.evaluations, self.best = list(state["evaluations"]), state["best"]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
