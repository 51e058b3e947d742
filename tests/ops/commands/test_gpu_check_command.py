"""`make gpu-check` without a GPU: the dry run CI runs, the same script a lent GPU machine runs.

scripts/gpu_check.sh runs under this python, from the repo as sent (dspark imported through the script's link,
not as installed), and must print one table in which each CUDA part is skipped with its reason and the rest
ran: the kernels under Triton's interpreter, equal to their references; the engine's greedy output identical to
the target alone's; a training step. Everything the check imports must exist on a GPU machine whose image has
only torch, Triton and transformers (and what they require). A check that disagrees fails the table.
"""
import ast
import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
import torch
from packaging.requirements import Requirement

from dspark.models.decoding.engine import Generation
from dspark.models.decoding.loading import load_target
from dspark.ops.harness.gpu_check.engine_rows import first_difference
from dspark.ops.harness.gpu_check.kernel_rows import OPS, Case, KernelShapes, compared, lengths_difference
from dspark.ops.harness.gpu_check.parts import check_rows
from dspark.ops.harness.gpu_check.table import failed

from tests.paths import EMBEDDED, REPO
from tests.test_import_graph import closure, modules

IMAGE = ("torch", "triton", "transformers")  # what a lent GPU machine's python has
OPTIONAL = {"flashinfer"}  # imported only after find_spec found it


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # the check sets it
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--out", str(out)], capture_output=True,
                            text=True, cwd="/", env={**env, "GPU_PYTHON": sys.executable}, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return result.stdout, (out / "gpu_check.md").read_text(), json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the check on a machine without CUDA")
def test_the_dry_run_prints_one_table_skipping_each_cuda_part_with_its_reason(dry_run):
    stdout, table, report = dry_run
    assert stdout.strip() == table.strip()  # stdout carries the table alone
    assert table.startswith("# gpu-check: CPU dry run")
    rows = {row["check"]: row for row in report["rows"]}
    assert len(rows) == len(report["rows"]) == len(table.strip().splitlines()) - 4
    for op in OPS:
        row = rows[f"{op}: dspark Triton vs PyTorch reference"]
        assert row["result"] == "ok" and row["max_abs_err"] <= 1e-5, row
        assert row["dspark"] == "not timed" and "no CUDA device" in row["notes"]
    flashinfer = next(row for check, row in rows.items() if check.startswith("flashinfer"))
    assert flashinfer["result"] == "skipped"
    assert "no CUDA device" in flashinfer["notes"] and "62.2 MiB" in flashinfer["notes"] and "16 MiB" in flashinfer["notes"]
    engine = [row for check, row in rows.items() if check.startswith("engine")]
    assert [row["result"] for row in engine] == ["ok", "ok"]  # identical greedy output, fixed and causal
    assert all(re.search(r"speedup \d+\.\d\dx, tau \d\.\d\d", row["notes"]) for row in engine)
    training = next(row for check, row in rows.items() if check.startswith("training"))
    assert training["result"] == "ok" and float(training["dspark"].removesuffix(" tok/s")) > 0


def test_the_check_imports_only_what_a_gpu_machine_has():
    roots = [name for name in modules() if name.startswith("dspark.ops.harness.gpu_check")]
    outside = {top for name in closure(roots) for top in top_level_imports(modules()[name])
               if top not in sys.stdlib_module_names and top != "dspark" and top not in OPTIONAL}
    needed = {canonical(dist) for top in outside for dist in metadata.packages_distributions().get(top, [top])}
    assert needed - required_by(IMAGE) == set()
    assert {"torch", "transformers"} <= needed  # the check can fail: it does see third-party imports


def test_a_kernel_that_disagrees_with_its_reference_fails_the_table():
    shapes = KernelShapes(batch_sizes=(2,), gamma=1, vocab=2, markov_rank=1, iters=1, compiled=False)
    row = compared("admission causal", "cpu", Case(lambda: torch.tensor([1, 2]), lambda: torch.tensor([1, 3]),
                                                   lengths_difference), torch.device("cpu"), shapes)
    assert row.result == "FAIL" and row.max_abs_err == 1 and row.notes == "1 of 2 lengths differ"
    assert failed([row])


def test_a_greedy_difference_is_located_with_the_targets_margin_there():
    target = load_target(EMBEDDED / "target", cpu_linears="default")
    prompt = target.tokenizer.encode("def main(")
    alone, drafted = Generation(prompt, token_ids=[11, 12, 13]), Generation(prompt, token_ids=[11, 14, 13])
    with torch.no_grad():
        top = target.model(torch.tensor([prompt + [11]])).logits[0, -1].topk(2).values
    note = first_difference(target, [prompt, prompt], [alone, alone], [alone, drafted])
    assert note == ("greedy output differs from the target alone's: prompt 1, token 1, where the target's top-2 "
                    f"logit margin is {float(top[0] - top[1]):.2g}")


def test_a_part_past_the_budget_is_skipped_and_named():
    rows = check_rows(torch.device("cpu"), EMBEDDED / "target", EMBEDDED / "dspark", deadline=0.0)
    assert {row.result for row in rows} == {"skipped"} and len(rows) == len(OPS) + 4
    assert all("time budget" in row.notes for row in rows) and not failed(rows)


def top_level_imports(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def required_by(roots) -> set[str]:
    """The distributions `roots` install with them (their unconditional requirements, recursively)."""
    seen, stack = set(), [canonical(root) for root in roots]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                stack.append(canonical(requirement.name))
    return seen
