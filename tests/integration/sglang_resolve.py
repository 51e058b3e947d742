"""SGLang's launcher up to the point where it would start serving: its plugins loaded, its arguments parsed and
resolved (`ServerArgs.resolve_once`, which every launch path calls before it starts a process), in a fresh
interpreter, as `python -m sglang.launch_server` does. dspark's plugin refuses a launch there (a drafter that does
not fit, an entry point the request gate cannot see), so a refused launch is tested without starting a server."""
from __future__ import annotations

import subprocess
import sys

from dspark.integration.server import server_environment

RESOLVE = """
import sys
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
load_plugins()
try:
    prepare_server_args(sys.argv[1:]).resolve_once()
except Exception as refusal:
    print(f"refused: {type(refusal).__name__}: {refusal}")
    sys.exit(3)
print("resolved")
"""
REFUSED_STATUS = 3


def resolve_launch(args: list[str], env: dict[str, str] | None = None, timeout_s: float = 180) -> str:
    """Why SGLang's launcher refuses `args` (the exception's type and message), or "" when it resolves them."""
    done = subprocess.run([sys.executable, "-c", RESOLVE, *args], env=server_environment(True, env),
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode not in (0, REFUSED_STATUS):
        raise RuntimeError(f"SGLang's launcher failed before resolving its arguments:\n{done.stderr[-3000:]}")
    return done.stdout.split("refused: ", 1)[1].strip() if done.returncode == REFUSED_STATUS else ""
