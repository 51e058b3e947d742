"""`dspark --version` (ops/cli.py): what a bug report needs, answered without loading any command."""
import importlib.metadata
import subprocess
import sys

import pytest

from dspark.ops.cli import main


def test_version_names_dspark_and_the_stack_it_runs_on(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    expected = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("dspark", "sglang", "torch", "transformers"))
    assert capsys.readouterr().out.strip() == expected


def test_version_loads_no_command():
    probe = ("import sys\nfrom dspark.ops.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(m for m in sys.modules if m.startswith(('dspark.ops.commands.', "
             "'dspark.ops.harness.'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
