"""The drafter training loop (DeepSpec's, docs/training.md), single process or data-parallel under torchrun.

One optimizer step = `grad_accum` micro-batches of `batch_size` samples per rank. Each micro-batch gets the frozen
target's outputs (tapped hidden states + next-token logits) from a target forward, or from the feature cache
(feature_cache.py), then runs the task's drafter forward and loss (tasks.py). Optimizer AdamW (β = 0.9/0.999,
eps 1e-8, lr 6e-4, weight decay 0) over the trainable parameters in fp32; LR linear warmup over int(0.04·steps)
steps (lr·(s+1)/warmup) then cosine to 0 over the remaining steps; gradient-norm clip 1.0; optional bf16 autocast
of both forwards (`bf16_autocast`; the loss terms stay fp32).

Data parallelism: the caller (`dspark train` under `torchrun --nproc-per-node N`) initialises torch.distributed
and passes a DistContext; the drafter is wrapped in DistributedDataParallel, each rank reads a disjoint slice of
each epoch's permutation, loss normalisers are all-reduced and the loss is multiplied by world_size to cancel
DDP's gradient averaging (as DeepSpec does). Only rank 0 writes checkpoints, logs and the progress bar. The single
process path (world_size 1) never touches torch.distributed.

With `fsdp` the drafter is sharded with FSDP2 instead (sharding.py): the same loss scaling, the parameters,
gradients and AdamW state split over the ranks, gathered onto rank 0 for checkpoints and the export.

Checkpoints: `<out>/checkpoints/step_XXXXXXX/trainer_state.pt` holds the drafter's fp32 state dict, optimizer,
scheduler, step, wall time, log history, torch RNG state and the run monitor's held-out checks (monitor.py);
`<out>/checkpoints/latest` names the newest; only the newest `keep_checkpoints` are kept. Data order and anchors
are stateless functions of (seed, step, micro-batch, rank), so resuming from a checkpoint continues exactly as an
uninterrupted run would. Written every `checkpoint_every` steps and at the end (also when the `max_minutes` budget
stops the run early).
"""
from __future__ import annotations

import contextlib
import math
import os
import pickle
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from dspark.models.errors import CheckpointError, ConfigError
from dspark.models.train_log import train_log_text
from dspark.models.training.data import TokenDataset
from dspark.models.training.feature_cache import OnlineFeatures
from dspark.models.training.monitor import RunMonitor
from dspark.models.training.sharding import full_state, load_full_state, shard_for_training
from dspark.models.training.tasks import TargetOutputs, TrainTask

TargetFeatureSource = Callable[[torch.Tensor, TokenDataset], TargetOutputs]  # (sample ids [bs], batch) -> outputs

LATEST = "latest"
STATE_FILE = "trainer_state.pt"
STEP_FOLDER = re.compile(r"step_\d{7}")
# A resumable state is ~12 bytes a drafter parameter (fp32 weights and two AdamW moments): 0.7 GB for SmolLM2's
# 5-layer DSpark: the scaling curve's runs, keeping every 50-step one, filled this machine's disk (41 GB of them).
KEEP_CHECKPOINTS = 2
RESUME_CHECKS = {  # what each plain value of a resume state must be (the weights are checked as they load)
    "step": lambda v: type(v) is int and v >= 0,
    "wall_s": lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
    "history": lambda v: isinstance(v, list),
    "scheduler": lambda v: isinstance(v, dict),
    "torch_rng": lambda v: isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1,
    "train_config": lambda v: isinstance(v, dict) and type(v.get("steps")) is int,
}
RESUME_KEYS = {"drafter", "optimizer", *RESUME_CHECKS}
LOG_FILE = "train_log.json"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (DeepSpec's defaults)."""

    steps: int = 1000
    max_minutes: float | None = None  # stop early (and checkpoint) when this wall budget is spent
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    batch_size: int = 8  # samples per micro-batch per rank
    grad_accum: int = 1
    bf16: bool = False
    checkpoint_every: int = 0  # 0: only at the end
    keep_checkpoints: int = KEEP_CHECKPOINTS  # the newest step folders kept; `latest` is always one of them
    log_every: int = 10
    seed: int = 42

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "grad_accum", "log_every", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"training {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0 or self.grad_clip <= 0:
            raise ConfigError(
                f"need lr > 0, weight_decay >= 0, grad_clip > 0; got {self.lr}, {self.weight_decay}, {self.grad_clip}"
            )
        if not 0 <= self.warmup_frac < 1:
            raise ConfigError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.checkpoint_every < 0 or (self.max_minutes is not None and self.max_minutes <= 0):
            raise ConfigError(
                f"checkpoint_every must be >= 0 and max_minutes > 0; got {self.checkpoint_every}, {self.max_minutes}"
            )


@dataclass(frozen=True)
class DistContext:
    """Where this process runs; world_size 1 means no torch.distributed at all."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    local_rank: int = 0  # among this node's ranks (torchrun's LOCAL_RANK)
    local_world_size: int = 1  # this node's ranks (LOCAL_WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(value, torch.distributed.ReduceOp.SUM)

    def max_over_ranks(self, value: int) -> int:
        return int(self._all_reduce(torch.tensor([value], device=self.device), torch.distributed.ReduceOp.MAX).item())

    def _all_reduce(self, value: torch.Tensor, op) -> torch.Tensor:
        if self.world_size == 1:
            return value
        value = value.clone()
        torch.distributed.all_reduce(value, op=op)
        return value


@dataclass(frozen=True)
class TrainResult:
    steps: int
    wall_s: float
    final_terms: dict[str, float]
    stopped_early: bool


def lr_factor(step: int, total_steps: int, warmup_frac: float) -> float:
    """Multiplier of the base LR at optimizer step `step` (0-indexed): linear warmup, then cosine to 0."""
    warmup = int(warmup_frac * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    decay_steps = max(total_steps - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, decay_steps) / decay_steps))


def bf16_autocast(enabled: bool, device: torch.device):
    """bf16 autocast on `device` when enabled (matmuls on AMX / tensor cores), else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def check_fills_a_batch(n_samples: int, cfg: TrainConfig, dist: DistContext) -> None:
    """Refuse a dataset smaller than one global micro-batch (every rank's --batch-size samples)."""
    per_batch = cfg.batch_size * dist.world_size
    if n_samples < per_batch:
        raise ConfigError(f"the training data has {n_samples} samples, fewer than one global batch ({per_batch}: "
                          f"--batch-size {cfg.batch_size} x {dist.world_size} rank(s)): add data or lower --batch-size")


def batch_indices(n_samples: int, cfg: TrainConfig, dist: DistContext, micro_index: int) -> torch.Tensor:
    """Sample indices of global micro-batch `micro_index` on this rank: a per-epoch permutation, sliced by rank."""
    check_fills_a_batch(n_samples, cfg, dist)
    per_batch = cfg.batch_size * dist.world_size
    epoch, j = divmod(micro_index, n_samples // per_batch)
    perm = torch.randperm(n_samples, generator=torch.Generator().manual_seed(cfg.seed + epoch))
    start = j * per_batch + dist.rank * cfg.batch_size
    return perm[start : start + cfg.batch_size]


class _ForwardTrain(torch.nn.Module):
    """Routes forward() to drafter.forward_train so DDP's gradient hooks see the training forward."""

    def __init__(self, drafter: torch.nn.Module) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, **kwargs):
        return self.drafter.forward_train(**kwargs)


class Trainer:
    """Trains `drafter` on `dataset` against the frozen `target` (module docstring)."""

    def __init__(
        self,
        drafter: torch.nn.Module,
        target: torch.nn.Module,
        dataset: TokenDataset,
        task: TrainTask,
        cfg: TrainConfig,
        out_dir: Path,
        dist: DistContext = DistContext(),
        progress: bool = True,
        features: TargetFeatureSource | None = None,  # default: run the target on each micro-batch
        monitor: RunMonitor | None = None,  # TensorBoard and the periodic held-out check (monitor.py): rank 0's,
        # or every rank's when the check runs a sharded target (only rank 0's writes)
        fsdp: bool = False,  # several ranks: shard the drafter with FSDP2 (sharding.py) instead of DDP
    ) -> None:
        self.drafter, self.target, self.dataset, self.task, self.cfg = drafter, target, dataset, task, cfg
        self.out_dir, self.dist, self.progress = Path(out_dir), dist, progress
        self.monitor = monitor
        self.target.requires_grad_(False).eval()
        self.features = features or OnlineFeatures(target, task.target_layer_ids)
        self.model = _ForwardTrain(drafter)
        self.fsdp = fsdp and dist.world_size > 1
        if self.fsdp:
            self.model = shard_for_training(self.model)
        elif dist.world_size > 1:
            ids = [dist.device.index] if dist.device.type == "cuda" else None
            self.model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.params = [p for p in drafter.parameters() if p.requires_grad]  # FSDP2 replaces them: read after it
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, cfg.steps, cfg.warmup_frac)
        )
        self.step, self.prior_wall_s, self.history = 0, 0.0, []
        self.window: list[dict[str, float]] = []  # the steps since the last log entry (a checkpoint keeps them)

    def _micro_step(self, micro_index: int, sync: bool) -> dict[str, float]:
        cfg, dist = self.cfg, self.dist
        index = batch_indices(len(self.dataset), cfg, dist, micro_index)
        batch = self.dataset.select(index)
        batch = TokenDataset(*(t.to(dist.device) for t in (batch.input_ids, batch.loss_mask, batch.attention_mask)))
        generator = torch.Generator().manual_seed((cfg.seed * 1_000_003 + micro_index) * dist.world_size + dist.rank)
        no_sync = self.model.no_sync if (dist.world_size > 1 and not sync and not self.fsdp) else contextlib.nullcontext
        if self.fsdp:
            self.model.set_requires_gradient_sync(sync)
        with bf16_autocast(cfg.bf16, dist.device):
            with torch.no_grad():
                target: TargetOutputs = self.features(index, batch)
            with no_sync():
                loss = self.task.loss(self.model, batch, target, generator, dist.all_reduce_sum)
                (loss.total * dist.world_size / cfg.grad_accum).backward()
        return self._global_terms(loss.terms)

    def _global_terms(self, terms: dict[str, float]) -> dict[str, float]:
        """Every logged term is a local sum over the global normaliser, so the global value is the sum over ranks."""
        if self.dist.world_size == 1:
            return terms
        values = torch.tensor(list(terms.values()), dtype=torch.float64, device=self.dist.device)
        summed = self.dist.all_reduce_sum(values)
        return dict(zip(terms, summed.tolist()))

    def optimizer_step(self) -> dict[str, float]:
        """One optimizer step (grad_accum micro-batches) without logging or checkpoints -> its loss terms,
        grad_norm and lr. `run` loops over it; `gpu-check` times it alone."""
        terms: dict[str, float] = {}
        for m in range(self.cfg.grad_accum):
            micro = self._micro_step(self.step * self.cfg.grad_accum + m, sync=m == self.cfg.grad_accum - 1)
            for key, value in micro.items():
                terms[key] = terms.get(key, 0.0) + value / self.cfg.grad_accum
        terms["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip))
        terms["lr"] = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return terms

    def run(self) -> TrainResult:
        """Train from the current step to cfg.steps (or until the time budget runs out); checkpoint at the end."""
        cfg, start = self.cfg, time.monotonic()
        budget_s = None if cfg.max_minutes is None else cfg.max_minutes * 60.0
        show = self.progress and self.dist.is_main
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", unit="step", disable=not show)
        if self.monitor:
            self.monitor.start(self.step)
        self.drafter.train()
        stopped_early, last = False, {}
        while self.step < cfg.steps:
            last = self.optimizer_step()
            self.window.append(last)
            bar.update(1)
            if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                self._log(self.window, self.prior_wall_s + time.monotonic() - start)
                bar.set_postfix({k: f"{v:.4g}" for k, v in self.history[-1].items() if k not in ("step", "wall_s")})
                self.window = []
            if self.monitor:
                self.monitor.after_step(self.step, self.drafter)
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps:
                self.save_checkpoint(self.prior_wall_s + time.monotonic() - start)
            out_of_time = budget_s is not None and self.prior_wall_s + time.monotonic() - start >= budget_s
            if out_of_time and self.step < cfg.steps:
                stopped_early = True
                break
        bar.close()
        if self.window:
            self._log(self.window, self.prior_wall_s + time.monotonic() - start)
            self.window = []
        if self.monitor:
            self.monitor.close()
        wall_s = self.prior_wall_s + time.monotonic() - start
        self.save_checkpoint(wall_s)
        final = self.history[-1] if self.history else last
        return TrainResult(steps=self.step, wall_s=wall_s, final_terms=final, stopped_early=stopped_early)

    def _log(self, window: list[dict[str, float]], wall_s: float) -> None:
        mean = {k: sum(t[k] for t in window) / len(window) for k in window[-1]}
        self.history.append({"step": self.step, "wall_s": round(wall_s, 2), **mean})
        if self.monitor:
            self.monitor.log(self.history[-1])

    def full_drafter_state(self) -> dict:
        """The drafter's state dict with full tensors (FSDP2: gathered onto rank 0, a collective every rank calls;
        other ranks get {})."""
        return full_state(self.model, self.optimizer)[0] if self.fsdp else self.drafter.state_dict()

    def save_checkpoint(self, wall_s: float) -> Path | None:
        """Write the resumable state for the current step and point `latest` at it (rank 0 writes; under FSDP2
        every rank takes part in gathering it)."""
        drafter_state, optimizer_state = (full_state(self.model, self.optimizer) if self.fsdp else
                                          (self.drafter.state_dict(), self.optimizer.state_dict()))
        if not self.dist.is_main:
            return None
        directory = self.out_dir / "checkpoints" / f"step_{self.step:07d}"
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "step": self.step,
            "wall_s": wall_s,
            "drafter": drafter_state,
            "optimizer": optimizer_state,
            "fsdp": self.fsdp,  # the optimizer state is keyed by parameter name under FSDP2, by index without
            "scheduler": self.scheduler.state_dict(),
            "history": self.history,
            "window": self.window,
            "torch_rng": torch.get_rng_state(),
            "train_config": asdict(self.cfg),
            "monitor": self.monitor.state_dict() if self.monitor else None,
        }
        torch.save(state, directory / STATE_FILE)
        pointer = self.out_dir / "checkpoints" / LATEST
        pointer.with_name(LATEST + ".tmp").write_text(directory.name + "\n")
        os.replace(pointer.with_name(LATEST + ".tmp"), pointer)  # a kill mid-write leaves the old pointer
        self.prune_checkpoints(directory)
        self.write_log(wall_s)
        return directory

    def prune_checkpoints(self, latest: Path) -> None:
        """Delete the step folders older than the newest `keep_checkpoints`, never `latest` (the one just written)."""
        folders = sorted(p for p in latest.parent.iterdir() if p.is_dir() and STEP_FOLDER.fullmatch(p.name))
        for old in folders[:-self.cfg.keep_checkpoints]:
            if old != latest:
                shutil.rmtree(old)

    def write_log(self, wall_s: float, extra: dict | None = None) -> None:
        """Write `<out>/train_log.json`: config, loss history and wall time (rank 0 only)."""
        if not self.dist.is_main:
            return
        log = {"train_config": asdict(self.cfg), "steps": self.step, "wall_s": round(wall_s, 2),
               "history": self.history}
        (self.out_dir / LOG_FILE).write_text(train_log_text({**log, **(extra or {})}))

    def resume(self) -> bool:
        """Load `<out>/checkpoints/latest` if present; returns whether a checkpoint was loaded."""
        pointer = self.out_dir / "checkpoints" / LATEST
        if not pointer.exists():
            return False
        if not pointer.is_file():
            raise CheckpointError(f"{pointer} is not a regular file: delete it to start over")
        with pointer.open("rb") as handle:
            name = handle.read(64).decode("ascii", errors="replace").strip()
        if not STEP_FOLDER.fullmatch(name):
            raise CheckpointError(f"{pointer} names {name!r}, not a step_NNNNNNN folder: delete it to start over")
        path = pointer.parent / name / STATE_FILE
        if not path.is_file():
            raise CheckpointError(
                f"{pointer} names {path.parent.name}, which has no {STATE_FILE}: delete {pointer} to start over"
            )
        try:  # weights_only: tensors and plain values, never code, whoever wrote the file
            state = torch.load(path, map_location=self.dist.device, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as error:
            raise CheckpointError(f"{path} cannot be read as a resume state ({str(error)[:200]}): delete {pointer} "
                                  "to start over") from None
        missing = RESUME_KEYS - (state.keys() if isinstance(state, dict) else set())
        if missing:
            raise CheckpointError(f"{path} is not a resume state of `dspark train` (it lacks {sorted(missing)}): "
                                  f"delete {pointer} to start over")
        wrong = sorted(key for key, valid in RESUME_CHECKS.items() if not valid(state[key]))
        if wrong:
            raise CheckpointError(f"{path} is not a resume state of `dspark train` ({', '.join(wrong)} of the wrong "
                                  f"kind): delete {pointer} to start over")
        if state["train_config"]["steps"] != self.cfg.steps:
            raise CheckpointError(
                f"checkpoint {path.parent} was trained for steps={state['train_config']['steps']}, this run has "
                f"steps={self.cfg.steps}: the LR schedule would differ; use the same --steps or a new --out"
            )
        if state.get("fsdp", False) != self.fsdp:
            raise CheckpointError(f"checkpoint {path.parent} was written {'with' if state.get('fsdp') else 'without'} "
                                  "--fsdp: resume it the same way")
        try:
            if self.fsdp:
                load_full_state(self.model, self.optimizer, state["drafter"], state["optimizer"])
            else:
                self.drafter.load_state_dict(state["drafter"])
                self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(f"checkpoint {path.parent} holds another drafter's state ({str(error)[:200]}): "
                                  "resume with the flags that wrote it, or use a new --out") from None
        try:
            self.scheduler.load_state_dict(state["scheduler"])
        except (TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"checkpoint {path.parent} holds no LR schedule of this run ({str(error)[:200]}): "
                                  "use a new --out") from None
        self.step, self.prior_wall_s, self.history = state["step"], state["wall_s"], state["history"]
        self.window = state.get("window", [])
        torch.set_rng_state(state["torch_rng"].cpu())
        if self.monitor and state.get("monitor"):
            self.monitor.load_state_dict(state["monitor"])
        return True
