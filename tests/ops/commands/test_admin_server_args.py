"""The admin flags `dspark serve` hands to its sidecar."""
import argparse

from dspark.ops.commands.admin_server import add_admin_args, add_otlp_args, admin_arg_list


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
