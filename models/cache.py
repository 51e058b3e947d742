"""Where dspark keeps what does not belong in the repo (venv, provided targets, SPS tables): $DSPARK_CACHE."""
import os
from pathlib import Path


def cache_root() -> Path:
    """$DSPARK_CACHE, or ~/.cache/dspark (the Makefile and scripts/setup_env.sh use the same default)."""
    return Path(os.environ.get("DSPARK_CACHE") or Path.home() / ".cache" / "dspark")
