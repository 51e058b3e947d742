"""Where SPS tables live, and which paths a live update may name.

dspark writes the tables it measures (the engine-start profile, ProfileSps, the SPS refit from traffic) under
the first directory of `DSPARK_SPS_DIR` (one or more directories, separated by os.pathsep; default
`$DSPARK_CACHE/sps`). A live update (the `dspark` key of `/set_internal_state`, which the admin plane's
UpdateState uses, validate_only included) may name a table only under one of those directories, or the very
table the server started with (DSPARK_RUNTIME_STATE / `--speculative-dspark-sps-table-path`); anything else is
refused before it is opened. The path's shape is checked first (a string without NUL, at most PATH_MAX bytes
and NAME_MAX per component), then its real path (symlinks and `..` resolved) must lie under a directory's real
path. One update naming "/" + "a" * 256 (ENAMETOOLONG) or a binary file used to take every scheduler down,
and the parse errors of any file the server could read were served back in `last_rejection`.

The environment is read by the process that checks (the scheduler), and the admin sidecar writes ProfileSps
tables with the same rule; `dspark serve` starts both with its own environment. A table mounted elsewhere
(the chart's /etc/dspark/sps) is allowed by listing its directory: DSPARK_SPS_DIR=$DSPARK_CACHE/sps:/etc/dspark/sps.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from dspark.models.cache import cache_root
from dspark.models.errors import ConfigError, shown

SPS_DIR_ENV = "DSPARK_SPS_DIR"
PATH_MAX, NAME_MAX = 4096, 255  # bytes, as Linux counts them


def sps_dirs() -> list[Path]:
    """The directories live tables may come from; the first is where dspark writes the tables it measures."""
    listed = [Path(part) for part in os.environ.get(SPS_DIR_ENV, "").split(os.pathsep) if part]
    return listed or [cache_root() / "sps"]


def sps_write_dir() -> Path:
    return sps_dirs()[0]


def confined_sps_path(value: str, started_with: Optional[str] = None, field: str = "sps_table") -> str:
    """`value` when a live update may name it (module docstring); otherwise a ConfigError naming the field, the
    bound and the value, raised before anything opens the file."""
    if value == started_with:
        return value
    if not shape_ok(value):
        raise ConfigError(f"{field} must be a path without NUL of at most {PATH_MAX} bytes and {NAME_MAX} per "
                          f"component, got {shown(value)}")
    real = real_path(value)
    allowed = [real_path(str(d)) for d in sps_dirs()]
    if real is not None and (any(d is not None and real.is_relative_to(d) for d in allowed)
                             or (started_with is not None and real == real_path(started_with))):
        return value
    bound = os.pathsep.join(str(d) for d in sps_dirs())
    raise ConfigError(f"{field} must name a table under {bound} (${SPS_DIR_ENV}) or the table the server started "
                      f"with, got {shown(value)}")


def shape_ok(value: str) -> bool:
    if "\0" in value:
        return False
    encoded = value.encode("utf-8", "surrogatepass")
    return len(encoded) <= PATH_MAX and all(len(part) <= NAME_MAX for part in encoded.split(b"/"))


def real_path(value: str) -> Optional[Path]:
    """The absolute path with every symlink resolved, or None when the system cannot say (a symlink loop, a
    name the file system cannot encode)."""
    try:
        return Path(os.path.realpath(value, strict=False))
    except (OSError, ValueError):
        return None
