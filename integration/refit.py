"""Refits from live traffic, in the scheduler process: the confidence head's STS temperatures from the calibration
window (calibration.py) and the SPS table from the measured round costs (models/decoding/round_cost.py).

On request, as one more form of a dspark update (`/set_internal_state`, the admin plane's Calibrate and
ProfileSps(from_traffic)), which becomes a `set` of the fitted values, so it is validated, versioned and
undoable like any change:

    {"refit_sts": {"min_samples": N}, "caller": ..., "expected_version": ...}   -> set sts_temperatures
    {"refit_sps": {"min_samples": N}, ...}   -> set sps_table to the measured table, written under
                                                <SPS dir>/refit/ (models/decoding/sps_paths.py; default
                                                $DSPARK_CACHE/sps/refit/), named by its content
    {"profile_sps": {}, ...}                 -> set sps_table to a table SGLang's forward measures now, in every
                                                scheduler between rounds (sps_forward.py), written under
                                                <SPS dir>/sglang/, named by its content

N is at least 1 and at most the window's size (MIN_SAMPLES_MAX: more could never be met).

Automatically, when the live setting `auto_refit_ece` is set: every time the calibration gauges are computed
(rounds.py), a window of at least `auto_refit_min_samples` rows in which some position with at least
AUTO_REFIT_MIN_LABELLED labels has an ECE above `auto_refit_ece` refits the temperatures as caller "auto-refit".
Installing new temperatures clears the window, so the next automatic refit needs as many fresh rows again.

Under tensor parallelism every rank takes the same update between the same rounds: the STS fit reads the
window, which holds the same replicated confidences and verdicts on every rank; the SPS fit reads wall-clock
times, so every rank installs rank 0's (planner.agreed).
Each function takes the scheduler process's `SchedulerState` (scheduler_state.py).
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark.integration import metrics
from dspark.integration.planner import agreed
from dspark.kernels.sps import SpsTable
from dspark.models.decoding.settings import VerifySettings
from dspark.models.decoding.round_cost import RoundCosts
from dspark.models.decoding.sps_paths import sps_write_dir
from dspark.models.calibration import LIVE_WINDOW_ROWS
from dspark.models.errors import ConfigError, shown

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

logger = logging.getLogger(__name__)

REFITS = ("refit_sts", "refit_sps", "profile_sps")
AUTO_REFIT_CALLER = "auto-refit"
AUTO_REFIT_MIN_LABELLED = 32
MIN_SAMPLES_MAX = {"refit_sts": LIVE_WINDOW_ROWS, "refit_sps": RoundCosts.WINDOW}  # the windows' sizes


def with_refit(state: SchedulerState, value: Any) -> Any:
    """A refit update becomes a `set` of what was fitted; anything else is returned as it is. Called once per
    update (admin.py's validation; the apply installs what it returned)."""
    if not (isinstance(value, dict) and set(REFITS) & set(value)):
        return value
    kinds = [kind for kind in REFITS if kind in value]
    if len(kinds) > 1 or "set" in value or "rollback_to" in value:
        raise ConfigError(f"a dspark update takes one of {list(REFITS)}, set or rollback_to, got "
                          f"{shown(sorted(value))}")
    options = value[kinds[0]]
    if kinds[0] == "profile_sps":
        if options != {}:
            raise ConfigError(f"profile_sps takes {{}}, got {shown(options)}")
        return {**{k: v for k, v in value.items() if k != kinds[0]}, "set": {"sps_table": profiled_table(state)}}
    if not isinstance(options, dict) or set(options) - {"min_samples"}:
        raise ConfigError(f"{kinds[0]} takes {{\"min_samples\": N}}, got {shown(options)}")
    minimum, most = options.get("min_samples", 1), MIN_SAMPLES_MAX[kinds[0]]
    if isinstance(minimum, bool) or not isinstance(minimum, int) or not 1 <= minimum <= most:
        raise ConfigError(f"{kinds[0]}.min_samples must be an integer in 1..{most} (the live window's size), "
                          f"got {shown(minimum)}")
    fitted = ({"sts_temperatures": state.calibration.refit(minimum)} if kinds[0] == "refit_sts"
              else {"sps_table": measured_table(state, minimum)})
    return {**{k: v for k, v in value.items() if k != kinds[0]}, "set": fitted}


def measured_table(state: SchedulerState, min_samples: int) -> str:
    """The SPS table fitted to the measured round costs (rank 0's under TP), written as JSON; its path."""
    table = state.sps_table()
    if table is None:
        raise ConfigError("there is no SPS table to refit from traffic: install or profile one first "
                          "(sps_table / ProfileSps)")
    fitted = state.clock.costs.fit(table, min_samples)
    fitted = SpsTable(fitted.sample_batch_tokens, tuple(agreed(list(fitted.sample_steps_per_sec), state.group)),
                      fitted.max_batch_tokens)
    return str(written(fitted, sps_write_dir() / "refit"))


def profiled_table(state: SchedulerState) -> str:
    """A table SGLang's forward measures now (every rank; rank 0's), written as JSON; its path."""
    from sglang.srt.runtime_context import get_spec

    from dspark.integration import sps_forward

    if state.scheduler is None or state.store is None:
        raise ConfigError("there is no scheduler to profile the SPS table in")
    table = sps_forward.measure(state.scheduler, int(get_spec().speculative_num_draft_tokens), state.group)
    path = written(table, sps_write_dir() / "sglang")
    state.measured_tables.add(str(path))
    return str(path)


def written(table: SpsTable, folder) -> Path:
    """`table` as JSON in `folder`, named by its content; the path."""
    text = table.to_text()
    path = folder / f"sps-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def maybe_auto_refit(state: SchedulerState, report: dict, settings: VerifySettings) -> bool:
    """Refit the temperatures when the calibration `report` (LiveCalibration.report) crosses the settings'
    threshold (module docstring); whether it did."""
    threshold = settings.auto_refit_ece
    if threshold is None or report["samples"] < settings.auto_refit_min_samples:
        return False
    worst = max((ece for ece, labels in zip(report["ece"], report["labelled"])
                 if ece is not None and labels >= AUTO_REFIT_MIN_LABELLED), default=0.0)
    if worst <= threshold:
        return False
    try:
        refit = {"refit_sts": {"min_samples": settings.auto_refit_min_samples}, "caller": AUTO_REFIT_CALLER}
        outcome = state.store.update(with_refit(state, refit))
    except ConfigError as err:  # a fit the state refuses: keep serving on the temperatures in effect
        logger.warning("dspark auto-refit of the STS temperatures refused: %s", err)
        metrics.observe_update("refused")
        return False
    logger.info("dspark auto-refit: ECE %.3f > %.3f on %d request-rounds; STS temperatures %s (version %d)",
                worst, threshold, report["samples"], outcome["state"]["sts_temperatures"], outcome["version"])
    metrics.observe_update("applied")
    state.trace.reset()
    return True
