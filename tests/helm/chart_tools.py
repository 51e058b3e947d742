"""Paths and helpers shared by the chart's tests (fixtures: conftest.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.paths import REPO

CHART = REPO / "helm" / "dspark"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
GPU_EXAMPLE = CHART / "examples" / "qwen3-8b-gpu.yaml"
LWS_EXAMPLE = CHART / "examples" / "lws-2node-tp16.yaml"
# what a cluster for the LWS example serves: a recent Kubernetes and the custom resources' APIs
LWS_FLAGS = ("--kube-version", "1.30.0", "--api-versions", "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet",
             "--api-versions", "keda.sh/v1alpha1/ScaledObject",
             "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")


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


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    """{kind/name: pod spec} of every workload; a LeaderWorkerSet gives its leader and worker templates."""
    pods = {}
    for doc in docs:
        spec, name = doc.get("spec", {}), f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("Deployment", "Job"):
            pods[name] = spec["template"]["spec"]
        elif doc["kind"] == "LeaderWorkerSet":
            for role in ("leaderTemplate", "workerTemplate"):
                pods[f"{name}/{role}"] = spec["leaderWorkerTemplate"][role]["spec"]
        elif doc["kind"] == "Pod":
            pods[name] = spec
    return pods
