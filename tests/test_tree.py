"""The tracked tree travels to a GPU machine, and its records name no machine's paths.

A lent GPU machine takes the working tree up to 64 MiB, wheels included: tracked files stay within 48 MiB so that 16 MiB
are left for wheels (docs/training.md#the-embedded-models). Cards, training logs and benchmark reports say where a file
came from in terms that hold on every machine ($DSPARK_CACHE/..., repo-relative; models/portable_paths.py).
"""
import re
import subprocess

import pytest

from tests.paths import REPO

MAX_TRACKED_BYTES = 48 * 2**20
RECORDS = ("embedded", "bench/results")
MACHINE_PATH = re.compile(r"(?<![\w.$~-])/(root|home|tmp|Users|work|check|mnt)/")


def tracked(*paths: str) -> list:
    try:
        listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", *paths], capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err}): nothing to measure")
    return [REPO / name for name in listing.decode().split("\0") if name]


def test_tracked_files_fit_the_gpu_machine_with_room_for_wheels():
    sizes = {path: path.stat().st_size for path in tracked() if path.is_file()}
    total = sum(sizes.values())
    largest = ", ".join(f"{path.relative_to(REPO)} {size / 2**20:.1f} MiB"
                        for path, size in sorted(sizes.items(), key=lambda item: -item[1])[:5])
    assert total <= MAX_TRACKED_BYTES, (f"tracked files take {total / 2**20:.1f} MiB, over the "
                                        f"{MAX_TRACKED_BYTES / 2**20:.0f} MiB bound; the largest: {largest}")


def test_records_name_no_machine_paths():
    found = []
    for path in tracked(*RECORDS):
        if path.suffix in (".md", ".json", ".jsonl", ".txt"):
            found += [f"{path.relative_to(REPO)}: {match.group(0)}"
                      for match in MACHINE_PATH.finditer(path.read_text(errors="replace"))]
    assert not found, f"{len(found)} machine paths, the first: {found[:5]}"
