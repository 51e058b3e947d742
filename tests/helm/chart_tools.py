"""Paths and helpers shared by the chart's tests (fixtures: conftest.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.paths import REPO

CHART = REPO / "helm" / "dspark"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))


def setup_k8s_tools(*flags: str) -> Path:
    """The toolchain's bin folder (scripts/setup_k8s_tools.sh; --clients: helm and kubectl only)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup_k8s_tools.sh"), *flags], check=True, text=True,
                         stdout=subprocess.PIPE)
    return Path(out.stdout.strip().splitlines()[-1])


def serve_settings(args: list[str]) -> dict:
    """The initial runtime state a rendered `dspark serve` argument list asks for, as dspark's own parser reads it."""
    from dspark.ops.cli import build_parser
    from dspark.ops.commands.settings_args import settings_from_args

    return settings_from_args(build_parser(["serve"]).parse_args(["serve", *args])).to_dict()


def find(docs: list[dict], kind: str, suffix: str = "") -> dict:
    """The one rendered resource of `kind` whose name ends with `suffix`."""
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return doc


def find_job(docs: list[dict], component: str) -> dict:
    """The one rendered Job of `component` (Jobs are named by their pod template's hash)."""
    (job,) = [d for d in docs if d["kind"] == "Job"
              and d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return job
