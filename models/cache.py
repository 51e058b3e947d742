"""Where dspark keeps what does not belong in the repo (venv, provided targets, SPS tables): $DSPARK_CACHE."""
import hashlib
import json
import os
from pathlib import Path


def cache_root() -> Path:
    """$DSPARK_CACHE, or ~/.cache/dspark (the Makefile and scripts/setup_env.sh use the same default)."""
    return Path(os.environ.get("DSPARK_CACHE") or Path.home() / ".cache" / "dspark")


def key_digest(key) -> str:
    """16 hex digits that name a cached artefact by what it was built from: `key`, any JSON value (dict order does
    not matter)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
