"""The live settings, written where `dspark serve` finds them if SGLang dies (ops/admin/restart.py).

`dspark serve` names the file in DSPARK_LIVE_SETTINGS_FILE; the first rank of the scheduler writes the state to it
at start and after every applied change (the runtime state store's `on_change`, so an update written just before
a crash is kept even if no round ran since), atomically, so that SGLang started again after a crash serves
with the settings it last had rather than those it was launched with.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from dspark.models.decoding.settings import VerifySettings

LIVE_SETTINGS_ENV = "DSPARK_LIVE_SETTINGS_FILE"
logger = logging.getLogger(__name__)


def write(state: VerifySettings) -> None:
    target = os.environ.get(LIVE_SETTINGS_ENV)
    if not target:
        return
    path = Path(target)
    temporary = path.with_suffix(".tmp")
    try:
        temporary.write_text(json.dumps(state.to_dict()))
        temporary.replace(path)
    except OSError as err:  # a full disk must not stop serving: a restart then falls back to the launch settings
        logger.warning("dspark: could not write the live settings to %s: %s", path, err)
