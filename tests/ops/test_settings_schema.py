"""One definition of every verify-plan setting: the CLI flags, the runtime state, the HTTP body and the gRPC
message all derive from models/decoding/settings.py, and this walk fails when any of them drifts in name,
default or range. kernels/ keeps only tensor math: it imports nothing from models/."""
import argparse
import ast
import json
import shutil
import subprocess
import sys
from dataclasses import fields

import pytest

from dspark.integration.runtime_state import RuntimeStateStore
from dspark.models.decoding.settings import VerifySettings, default_of, names, spec_of
from dspark.models.errors import ConfigError
from dspark.ops.admin.v1 import admin_pb2 as pb
from dspark.ops.cli import build_parser
from dspark.ops.commands import eval as eval_command

from tests.paths import REPO

SETTINGS_COMMANDS = ("generate", "eval", "demo", "serve")  # every command that takes the settings


def subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def settings_actions(parser: argparse.ArgumentParser) -> dict:
    return {a.dest: a for a in parser._actions if a.dest in names()}


@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_every_decoding_command_takes_every_setting_with_the_schema_default_and_choices(command):
    actions = settings_actions(subparser(command))
    assert sorted(actions) == sorted(names())
    own_defaults = eval_command.SETTINGS_DEFAULTS if command == "eval" else {}  # eval drafts every round
    for name, action in actions.items():
        spec = spec_of(name)
        assert action.option_strings == ["--" + name.replace("_", "-")]
        assert action.default == own_defaults.get(name, default_of(name)), name
        assert f"(default: {action.default})" in action.help, name
        assert tuple(action.choices or ()) == spec.choices, name
        assert spec.range_text() in action.help, name


def test_admin_set_takes_every_setting_as_an_optional_patch():
    actions = settings_actions(subparser("admin", "set"))
    assert sorted(actions) == sorted(names())
    assert all(a.default is argparse.SUPPRESS for a in actions.values())


def test_the_proto_mirrors_the_schema_in_name_type_default_and_range():
    descriptor = pb.Settings.DESCRIPTOR
    assert [f.name for f in descriptor.fields] == list(names())
    for field in descriptor.fields:
        spec, options = spec_of(field.name), field.GetOptions()
        kind = {field.TYPE_STRING: str, field.TYPE_INT64: int, field.TYPE_DOUBLE: float}[field.type]
        assert kind is spec.kind, field.name
        assert field.is_repeated == spec.per_position, field.name
        assert json.loads(options.Extensions[pb.setting_default]) == default_of(field.name), field.name
        assert options.Extensions[pb.setting_range] == spec.range_text(), field.name


def test_the_runtime_state_and_http_body_are_the_schema():
    store = RuntimeStateStore(VerifySettings(policy="fixed"), gamma=4)
    report = store.report()
    assert {name: report[name] for name in names()} == VerifySettings(policy="fixed").to_dict()
    assert [f.name for f in fields(VerifySettings)] == list(names())


@pytest.mark.parametrize("values, problem", [
    ({"policy": "causal", "threshold_on": "x"}, "threshold_on must be one of survival|confidence"),
    ({"policy": "fixed", "threshold": 1.5}, r"threshold must be in \[0, 1\]"),
    ({"policy": "fixed", "min_verify_length": -1}, "min_verify_length must be in 0..gamma"),
    ({"policy": "fixed", "min_verify_length": 2, "max_verify_length": 1}, "max_verify_length must be in"),
    ({"policy": "fixed", "budget_fraction": 0.0}, r"budget_fraction must be in \(0, 1\]"),
    ({"policy": "fixed", "max_batch_tokens": 0}, "max_batch_tokens must be in 1.."),
    ({"policy": "fixed", "min_verify_length": True}, "min_verify_length must be an integer"),
    ({"policy": "fixed", "threshold": "0.4"}, "threshold must be a finite number or null"),
    ({"policy": "fixed", "threshold": float("nan")}, "threshold must be a finite number"),
    ({"policy": "fixed", "sts_temperatures": [1.0, 0.0]}, r"sts_temperatures must be in \(0, inf\)"),
    # a window larger than the live one would never fill: automatic refits silently off
    ({"auto_refit_min_samples": 4097}, r"auto_refit_min_samples must be in 1\.\.4096, got 4097"),
    ({"policy": "threshold"}, "the threshold policy needs a threshold"),
    ({"policy": None}, "policy must not be null"),
])
def test_each_value_is_checked_whatever_the_policy(values, problem):
    with pytest.raises(ConfigError, match=problem):
        VerifySettings.from_dict(values)


def test_kernels_import_nothing_from_models():
    for path in (REPO / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            imported = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not any(m.startswith(("dspark.models", "dspark.integration", "dspark.ops")) for m in imported), \
                f"{path.relative_to(REPO)} imports {imported}"


def test_the_generated_grpc_code_is_current(tmp_path):
    """`make proto` output committed beside admin.proto matches the proto and the proto's Settings the schema
    (regenerate when this fails)."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "ops" / "admin" / "v1", copy / "ops" / "admin" / "v1")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    subprocess.run([sys.executable, str(copy / "scripts" / "gen_proto.py")], check=True, capture_output=True)
    for name in ("admin.proto", "admin_pb2.py", "admin_pb2_grpc.py", "admin_pb2.pyi"):
        assert (copy / "ops" / "admin" / "v1" / name).read_text() == \
            (REPO / "ops" / "admin" / "v1" / name).read_text(), name
