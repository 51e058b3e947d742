"""The admin flags `dspark serve` hands to its sidecar, and the finite floats of every command's flags."""
import argparse

import pytest

from dspark.ops.cli import build_parser
from dspark.ops.admin.sidecar import add_admin_args, add_otlp_args, admin_arg_list


def test_token_files_are_passed_absolute_but_through_their_symlinks(tmp_path, monkeypatch):
    # Kubernetes mounts a Secret key as name -> ..data/name -> ..<timestamp>/name and swaps ..data on rotation
    (tmp_path / "..2026_12_01").mkdir()
    (tmp_path / "..2026_12_01" / "ops").write_text("secret\n")
    (tmp_path / "..data").symlink_to("..2026_12_01")
    (tmp_path / "ops").symlink_to("..data/ops")
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_admin_args(parser)
    add_otlp_args(parser)
    args = parser.parse_args(["--admin-port", "50051", "--admin-token-file", "ops"])
    passed = admin_arg_list(args)
    assert passed[passed.index("--admin-token-file") + 1] == str(tmp_path / "ops")


def test_the_audit_bounds_are_passed_on():
    parser = argparse.ArgumentParser()
    add_admin_args(parser)
    add_otlp_args(parser)
    passed = admin_arg_list(parser.parse_args(["--admin-port", "1", "--admin-audit-max-bytes", "65536",
                                               "--admin-audit-keep", "0"]))
    assert passed[passed.index("--admin-audit-max-bytes") + 1] == "65536"
    assert passed[passed.index("--admin-audit-keep") + 1] == "0"
    defaults = admin_arg_list(parser.parse_args(["--admin-port", "1"]))
    assert defaults[defaults.index("--admin-audit-max-bytes") + 1] == str(10 << 20)
    assert defaults[defaults.index("--admin-audit-keep") + 1] == "5"


def float_actions():
    """(command, flag, type) of every flag of every dspark command whose values are floats."""
    found = []
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    pending = list(commands.choices.items())
    while pending:
        name, parser = pending.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
            elif action.type is not None and getattr(action.type, "__name__", "") in ("float", "finite_float"):
                found.append((name, action.option_strings[0], action.type))
    return found


def test_every_float_flag_of_every_command_refuses_nan_and_infinities():
    found = float_actions()
    assert {"admin-server --admin-update-rate", "admin set --threshold", "serve --threshold", "train --lr",
            "soak --duration"} <= {f"{command} {flag}" for command, flag, _ in found}
    for command, flag, kind in found:
        assert kind("0.5") == 0.5, (command, flag)
        for text in ("nan", "inf", "-Infinity"):
            with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number"):
                kind(text)
