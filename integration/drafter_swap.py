"""A drafter checkpoint loaded into the running server, in the scheduler process, between rounds (no restart).

    POST /set_internal_state {"server_args": {"dspark_drafter": {"path": "/abs/drafter"}}}
      -> [{"drafter": {"path", "version", "loaded_at", "swaps"}, "previous": {...}, "seconds": s}] per scheduler,
         or HTTP 400 naming why the drafter was refused, with the drafter in use unchanged

The load is SGLang's own in-place draft weight update: each runner the DSpark worker lists for weight updates
(`weight_update_runners`, role "draft") reloads its weights from the new folder with its `weight_updater`
(`update_weights_from_disk`, which restores the weights it had when a load fails). It runs in the scheduler's loop,
as SGLang handles `/set_internal_state`, so the rounds in flight pause for the load and go on with the new weights:
no request is lost, and answers stay exact (verification is lossless whatever the drafter drafts). Requests in
flight keep the draft K/V the old weights wrote for their context; new requests that reuse a cached prefix too.

Before anything is loaded the drafter must be the served one in everything but its weights, or it is refused naming
what differs: its config fits the target (models/checkpoint.py `read_drafter_config`), every setting equals the
served drafter's (kind, block size, dimensions, tapped layers, heads, mask token), its weights file holds exactly
the tensors and shapes that config needs (read from the header only), its draft vocabulary is a valid one for the
target's vocabulary, and the target fingerprint its training recorded (train_log.json `job.target_sha256`), when
it recorded one, is the served target's. The request carries this key alone, so nothing else changes with it.

The version is the sha256 of the weights SGLang loads (models/target_io.py `target_fingerprint`; a compact
checkpoint loads as its full-row copy, models/checkpoint.py `sglang_checkpoint`), reported in /server_info's
dspark state (`drafter`), the admin plane's state, `dspark_drafter_info{version}` and the capture's records.
"""
from __future__ import annotations

import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from dspark.integration import metrics
from dspark.integration.draft_vocab_mask import draft_vocab_mask, refresh_mask
from dspark.models.cache import cache_root
from dspark.models.checkpoint import (CONFIG_FILE, WEIGHTS_FILE, check_weights_match, differing_settings,
                                      read_drafter_config, sglang_checkpoint)
from dspark.models.errors import DsparkError, shown
from dspark.models.target_io import target_fingerprint

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

logger = logging.getLogger(__name__)

KEY = "dspark_drafter"
MAX_PATH_CHARS = 4096
TRAIN_LOG = "train_log.json"
MAX_TRAIN_LOG_BYTES = 16 * 1024 * 1024


class Refused(Exception):
    """Why a drafter is not loaded (the reply's reason)."""


def served_drafter(state: SchedulerState) -> Optional[dict]:
    """The drafter the draft runners hold now: its path and version (fingerprinted once, at the first report)."""
    if state.drafter is None and state.scheduler is not None:
        path = state.scheduler.server_args.speculative_draft_model_path
        if path is None:
            return None
        state.drafter = {"path": str(path), "version": target_fingerprint(Path(path)), "loaded_at": time.time(),
                         "swaps": 0}
        metrics.observe_drafter(state.drafter["version"], None)
    return state.drafter


def requested_path(value: Any) -> Path:
    """The drafter folder of a request, checked as hostile input."""
    if not isinstance(value, dict) or set(value) != {"path"}:
        raise Refused(f"{KEY} takes {{\"path\": \"/absolute/drafter/folder\"}}, got {shown(value)}")
    path = value["path"]
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH_CHARS or "\0" in path:
        raise Refused(f"{KEY}.path must be a string of 1..{MAX_PATH_CHARS} characters, got {shown(path)}")
    folder = Path(path)
    if not folder.is_absolute():
        raise Refused(f"{KEY}.path must be absolute (the server runs elsewhere than its caller), got {shown(path)}")
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise Refused(f"{KEY}.path {shown(path)} is not a drafter folder (no {CONFIG_FILE} and {WEIGHTS_FILE})")
    return folder


def recorded_target(folder: Path) -> Optional[str]:
    """The target fingerprint the drafter's training recorded (None: it recorded none, e.g. a converted one)."""
    log = folder / TRAIN_LOG
    if not log.is_file():
        return None
    if log.stat().st_size > MAX_TRAIN_LOG_BYTES:
        raise Refused(f"{log} is {log.stat().st_size} bytes, above the bound {MAX_TRAIN_LOG_BYTES}")
    try:
        recorded = json.loads(log.read_text()).get("job", {}).get("target_sha256")
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise Refused(f"{log} is not a training log (JSON with job.target_sha256)") from None
    if recorded is not None and not isinstance(recorded, str):
        raise Refused(f"{log}: job.target_sha256 must be a string, got {shown(recorded)}")
    return recorded


def check_candidate(state: SchedulerState, folder: Path) -> Path:
    """The folder SGLang loads for the drafter at `folder`, once it is the served drafter in all but its weights
    (module docstring); Refused naming what differs."""
    scheduler = state.scheduler
    target_config = scheduler.tp_worker.model_runner.model_config.hf_config
    served_path = Path(served_drafter(state)["path"])
    try:
        config = read_drafter_config(folder, target_config)
        differing = differing_settings(read_drafter_config(served_path), config, "serving")
        if differing:
            raise Refused(f"{folder} is another drafter than the one served: " + ", ".join(differing))
        loadable = sglang_checkpoint(folder, cache_root())
        check_weights_match(config, header_shapes(loadable / WEIGHTS_FILE), str(loadable / WEIGHTS_FILE))
        draft_vocab_mask(folder, config.vocab_size, "cpu")  # a malformed draft_vocab.json is refused here
    except DsparkError as err:
        raise Refused(str(err)) from None
    recorded = recorded_target(folder)
    if recorded is not None:
        if state.target_version is None:
            state.target_version = target_fingerprint(Path(scheduler.server_args.model_path))
        if recorded != state.target_version:
            raise Refused(f"{folder} was trained for another target: its {TRAIN_LOG} records target_sha256 "
                          f"{recorded[:16]}..., the served target's is {state.target_version[:16]}...")
    return loadable


def header_shapes(weights: Path) -> dict:
    """name -> a meta tensor of each stored tensor's shape (the header only: no weight is read)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as handle:
        return {name: torch.empty(handle.get_slice(name).get_shape(), device="meta") for name in handle.keys()}


def load(state: SchedulerState, loadable: Path) -> None:
    """SGLang's in-place weight update of every draft runner from `loadable`; Refused (the old weights back) when
    one fails. The draft vocabulary mask is read beside the checkpoint its model's config names."""
    for _role, runner in state.scheduler.draft_worker.weight_update_runners():
        model = runner.model
        previous = model.config._name_or_path
        model.config._name_or_path = str(loadable)  # the draft-vocabulary hook reads the mask beside it
        loaded, message = runner.weight_updater.update_weights_from_disk(str(loadable), "auto")
        if not loaded:
            model.config._name_or_path = previous
            refresh_mask(model)  # SGLang restored the old weights: their mask too
            raise Refused(f"SGLang could not load {loadable}: {message}")


def _validate(state: SchedulerState, key: str, value) -> None:
    """Check, then load (SGLang validates every key before it applies any, and this key comes alone, so a load
    that fails here is refused as a whole, with the old weights back); the apply records what was loaded."""
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

    begin = time.monotonic()
    try:
        if state.scheduler is None or state.scheduler.draft_worker is None or served_drafter(state) is None:
            raise Refused(f"{key} needs a server speculating with a DSpark drafter")
        folder = requested_path(value)
        loadable = check_candidate(state, folder)
        load(state, loadable)
    except Refused as refused:
        state.update.refusal = f"drafter not loaded: {refused}"
    except Exception:  # a bug, not the caller's doing: keep serving on the drafter in use
        logger.exception("dspark: loading a drafter failed")
        state.update.refusal = "drafter not loaded: it could not be checked or loaded (see the server log)"
    if state.update.refusal is not None:
        logger.warning(state.update.refusal)
        raise UpdateRejected(state.update.refusal)
    previous = dict(state.drafter)
    state.drafter = {"path": str(loadable), "version": target_fingerprint(loadable), "loaded_at": time.time(),
                     "swaps": previous["swaps"] + 1}
    state.update.applied = {"drafter": state.drafter, "previous": previous, "seconds": time.monotonic() - begin}
    state.calibration.reset()  # its predictions were the old confidence head's
    metrics.observe_drafter(state.drafter["version"], previous["version"])
    logger.info(f"dspark: drafter {previous['version'][:16]}... -> {state.drafter['version'][:16]}... from "
                f"{loadable} in {state.update.applied['seconds']:.2f} s")


def _apply(state: SchedulerState, key: str, value) -> None:
    """Nothing left to do: the validation loaded the drafter (there is no setting to override)."""


def handler(state: SchedulerState):
    from sglang.srt.managers.scheduler_components.internal_state import _UpdateHandler

    return _UpdateHandler(partial(_validate, state), partial(_apply, state))


def refuse_with_others(requested: dict) -> Optional[str]:
    """Why a `/set_internal_state` body that carries KEY with other keys is refused (None: it does not)."""
    if KEY in requested and len(requested) > 1:
        return f"{KEY} comes alone in a request (got {shown(sorted(requested))})"
    return None
