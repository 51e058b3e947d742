"""Imports point down, read from the source (every import statement, function-level ones too):

- the layers: ops -> integration -> models -> kernels, never the other way;
- no cycle between the parts of models/ (its subfolders and top-level modules): target I/O, prompts and the
  calibration metrics sit below decoding, training and evaluation;
- serving never loads the trainer: `dspark serve`, `dspark generate` and everything in integration/ import
  nothing from models/training, directly or through what they import;
- the CLI's commands do not import each other, and `dspark NAME` loads NAME alone: the admin sidecar starts
  without transformers or matplotlib.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from dspark.ops.cli import COMMANDS

from tests.paths import REPO

LAYERS = ("kernels", "models", "integration", "ops")  # bottom to top
SERVING_ROOTS = ("dspark.ops.commands.serve", "dspark.ops.commands.generate")


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the four layers (setup.py maps folder X to dspark.X)."""
    out = {}
    for layer in LAYERS:
        for path in (REPO / layer).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(("dspark",) + (parts[:-1] if parts[-1] == "__init__" else parts))
            out[name] = path
    return out


@lru_cache(maxsize=None)
def imports(name: str) -> frozenset[str]:
    """The dspark modules `name` imports (`from package import module` counts the module)."""
    found = set()
    for node in ast.walk(ast.parse(modules()[name].read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(m for m in found if m in modules())


def closure(roots) -> set[str]:
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(imports(name))
    return seen


def models_part(name: str) -> str:
    """dspark.models.decoding.engine -> decoding; dspark.models.checkpoint -> checkpoint."""
    return name.split(".")[2] if name.count(".") >= 2 else "models"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each node that lies on one (depth-first search)."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_layer_imports_only_the_layers_below_it():
    upward = [(name, target) for name in modules() for target in imports(name)
              if LAYERS.index(target.split(".")[1]) > LAYERS.index(name.split(".")[1])]
    assert upward == []


def test_the_parts_of_models_import_each_other_without_a_cycle():
    graph: dict[str, set[str]] = {}
    for name in modules():
        if name.startswith("dspark.models."):
            for target in imports(name):
                if target.startswith("dspark.models.") and models_part(target) != models_part(name):
                    graph.setdefault(models_part(name), set()).add(models_part(target))
    assert cycles(graph) == []


def test_serving_imports_nothing_from_training():
    roots = SERVING_ROOTS + tuple(name for name in modules() if name.startswith("dspark.integration."))
    reached = closure(roots)
    assert sorted(name for name in reached if name.startswith("dspark.models.training")) == []
    assert "dspark.models.target_io" in reached  # the check can fail: serving does read the target


def test_no_command_imports_another():
    commands = set(COMMANDS.values())
    assert [(name, target) for name in commands for target in imports(name) if target in commands] == []


def test_the_admin_sidecar_starts_without_transformers_or_matplotlib(tmp_path):
    script = ("import json, sys\nfrom dspark.ops.cli import main\ntry:\n    main(['admin-server', '--help'])\n"
              "except SystemExit:\n    pass\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('transformers', 'matplotlib') or m.startswith('dspark.ops.'))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if not m.startswith("dspark.")] == []
    assert "dspark.ops.commands.admin_server" in loaded
    assert [m for m in loaded if m.startswith(("dspark.ops.commands.", "dspark.ops.harness."))
            and m not in ("dspark.ops.commands", "dspark.ops.commands.admin_server")] == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
