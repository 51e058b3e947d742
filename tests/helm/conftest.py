"""The chart's tests use the real toolchain of scripts/setup_k8s_tools.sh (helm v4.1.4, kubectl, and a
kube-apiserver v1.20.2 built from Debian's source), installed once under $DSPARK_CACHE/k8s; `make test` runs
the script first, and the fixtures run it again (a no-op then) so that `pytest tests/helm` alone works too."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.chart_tools import CHART, setup_k8s_tools


@pytest.fixture(scope="session")
def k8s_bin() -> Path:
    return setup_k8s_tools("--clients")


@pytest.fixture(scope="session")
def helm(k8s_bin):
    def run(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([str(k8s_bin / "helm"), *args], check=check, text=True, capture_output=True, **kwargs)
    return run


@pytest.fixture(scope="session")
def render(helm):
    """Rendered manifests (a list of dicts) of the chart with helm's flags (-f, --set, --api-versions...)."""
    def run(*flags: str) -> list[dict]:
        out = helm("template", "dspark", str(CHART), "--namespace", "dspark", *flags).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]
    return run
