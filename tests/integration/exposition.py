"""A server's Prometheus exposition (/metrics), read in tests."""
from __future__ import annotations

import urllib.request
from typing import Optional


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        return response.read().decode()


def samples(exposition: str) -> list[tuple[str, float]]:
    """Every sample line as (the sample as written: a name, then its labels; its value); comments left out."""
    return [(written, float(value)) for written, value in
            (line.rsplit(" ", 1) for line in exposition.splitlines() if line and not line.startswith("#"))]


def sample_value(exposition: str, sample: str) -> Optional[float]:
    """The value of the sample written `sample` (a name, then its labels as the exposition orders them); None when
    it is not there."""
    return next((value for written, value in samples(exposition) if written == sample), None)


def values_of(exposition: str, name: str) -> list[float]:
    """The values of every sample of the metric `name`, whatever its labels, in exposition order."""
    return [value for written, value in samples(exposition) if written.split("{", 1)[0] == name]
