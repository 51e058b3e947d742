"""Paths as records should show them: the same on every machine.

Cards, logs and benchmark reports say where a file came from. An absolute path says which machine wrote it
(/root/.cache/..., a checkout's location), so a recorded path is written as $DSPARK_CACHE/... under the cache,
relative to the working directory under it (the repo, where the Makefile runs), and as ~/... under home.
"""
import os
from pathlib import Path

from dspark.models.cache import cache_root


def portable(path) -> str:
    """`path` (a str or Path, absolute or not) as a record should show it (module docstring)."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    resolved = Path(text)
    for root, shown in ((cache_root(), "$DSPARK_CACHE"), (Path.cwd(), None), (Path.home(), "~")):
        try:
            relative = resolved.relative_to(root)
        except ValueError:
            continue
        if shown is None:
            return str(relative)
        return shown if relative == Path(".") else f"{shown}/{relative}"
    return text

