"""The training corpus: the CPython standard-library source of an interpreter.

Which files: every `*.py` under the stdlib root, except files under a directory whose name is in
`EXCLUDED_DIRS` (any depth) and the build-generated files matched by `BUILD_SPECIFIC_PATTERNS`:
- `test`, `tests`, `idle_test`: test suites (lib2to3's test data is not even valid Python 3);
- `encodings`: codec tables ("LATIN SMALL LETTER ...") that swamp a small corpus;
- `pydoc_data`: 757 KB of English help text, not code;
- `site-packages`, `dist-packages`: third-party packages, which differ per machine;
- `__pycache__`: never holds `.py`, listed so a stray file there is ignored too.
The `_sysconfigdata_*` module and the `config-*` directory are written by the interpreter's build
(install paths, compiler flags), so they differ between two machines with the same Python version.

Split: a file is held out when the first 8 hex digits of sha256(relative posix path), read as an
integer, modulo 100 fall below `held_out_percent`. The rule depends only on the path, so it is
deterministic, independent of file order and of which other files exist, and train/held-out are
disjoint by construction.

Files are read with `tokenize.open`, which honours PEP 263 coding cookies. Only regular files are listed (a FIFO
named `x.py` would block the read forever), and the walk is bounded (`MAX_CORPUS_DIRS`, `MAX_CORPUS_FILES`,
`MAX_CORPUS_BYTES`, each about 20x CPython's Lib/), so `--stdlib /` is refused in a moment instead of walking the
whole disk.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import sysconfig
import tokenize
from pathlib import Path

from dspark.models.errors import ConfigError
from dspark.models.portable_paths import portable

EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages", "dist-packages", "__pycache__"}
)
BUILD_SPECIFIC_PATTERNS = ("_sysconfigdata_*.py", "config-*")
DEFAULT_HELD_OUT_PERCENT = 5
HELD_OUT_PERCENT_RANGE = (1, 99)
MAX_CORPUS_DIRS, MAX_CORPUS_FILES, MAX_CORPUS_BYTES = 2000, 10_000, 256 << 20  # Lib/: ~50, ~600, ~10 MB
SPLIT_RULE = "held out iff int(sha256(relative_posix_path).hexdigest()[:8], 16) % 100 < held_out_percent"


def default_stdlib_root() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_corpus_file(relative_path: str) -> bool:
    """Whether a `*.py` path relative to the stdlib root belongs to the corpus."""
    parts = relative_path.split("/")
    if any(part in EXCLUDED_DIRS for part in parts[:-1]):
        return False
    return not any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in BUILD_SPECIFIC_PATTERNS)


def is_held_out(relative_path: str, held_out_percent: int) -> bool:
    """The split rule (see SPLIT_RULE): a stable hash of the path, never of the content or the order."""
    bucket = int(hashlib.sha256(relative_path.encode("utf-8")).hexdigest()[:8], 16) % 100
    return bucket < held_out_percent


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The corpus files of one stdlib root, split into train and held-out (sorted relative paths)."""

    root: Path
    held_out_percent: int
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]

    def __post_init__(self) -> None:
        low, high = HELD_OUT_PERCENT_RANGE
        if not low <= self.held_out_percent <= high:
            raise ConfigError(f"held_out_percent must be in [{low}, {high}], got {self.held_out_percent}: pick e.g. 5")
        if not self.train_files or not self.held_out_files:
            raise ConfigError(
                f"corpus at {self.root} has {len(self.train_files)} train and {len(self.held_out_files)} "
                "held-out files; both must be non-empty: point --stdlib at a CPython Lib/ directory"
            )

    def read(self, relative_path: str) -> str:
        with tokenize.open(self.root / relative_path) as handle:
            return handle.read()

    def train_texts(self) -> list[str]:
        return [self.read(path) for path in self.train_files]

    def held_out_texts(self) -> list[str]:
        return [self.read(path) for path in self.held_out_files]

    def describe(self) -> dict:
        """Counts, sizes, the rule and the file lists, for the model card and train_log.json."""
        return {
            "root": portable(self.root),
            "excluded_dirs": sorted(EXCLUDED_DIRS),
            "excluded_build_files": list(BUILD_SPECIFIC_PATTERNS),
            "split_rule": SPLIT_RULE,
            "held_out_percent": self.held_out_percent,
            "train_file_count": len(self.train_files),
            "held_out_file_count": len(self.held_out_files),
            "train_bytes": sum((self.root / p).stat().st_size for p in self.train_files),
            "held_out_bytes": sum((self.root / p).stat().st_size for p in self.held_out_files),
            "train_files": list(self.train_files),
            "held_out_files": list(self.held_out_files),
        }


def _python_files(root: Path) -> list[str]:
    """Relative posix paths of the regular `*.py` files under root, not descending into excluded directories;
    refused past the walk's bounds."""
    found, walked, size = [], 0, 0
    for directory, subdirs, files in os.walk(root):
        walked += 1
        if walked > MAX_CORPUS_DIRS:
            raise ConfigError(f"stdlib root {root} holds over {MAX_CORPUS_DIRS} directories: not a CPython Lib/")
        subdirs[:] = [name for name in subdirs if name not in EXCLUDED_DIRS]
        relative = Path(directory).relative_to(root)
        for name in files:
            path = Path(directory) / name
            if name.endswith(".py") and path.is_file():
                found.append((relative / name).as_posix())
                size += path.stat().st_size
        if len(found) > MAX_CORPUS_FILES or size > MAX_CORPUS_BYTES:
            raise ConfigError(f"stdlib root {root} holds over {MAX_CORPUS_FILES} .py files or "
                              f"{MAX_CORPUS_BYTES >> 20} MiB of them: not a CPython Lib/")
    return found


def load_corpus(root: Path, held_out_percent: int = DEFAULT_HELD_OUT_PERCENT) -> Corpus:
    """List and split the corpus files under `root` (a CPython `Lib/` directory)."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"stdlib root {root} is not a directory: pass the interpreter's Lib/ directory")
    chosen = sorted(path for path in _python_files(root) if is_corpus_file(path))
    return Corpus(
        root=root,
        held_out_percent=held_out_percent,
        train_files=tuple(p for p in chosen if not is_held_out(p, held_out_percent)),
        held_out_files=tuple(p for p in chosen if is_held_out(p, held_out_percent)),
    )
