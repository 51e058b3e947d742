#!/usr/bin/env bash
# `make gpu-check`: the first thing to run on a lent GPU machine (ops/harness/gpu_check says what it checks).
#
# It runs from this repo as sent, under the machine's own Python (GPU_PYTHON, default python3) with the torch,
# Triton and transformers that Python has: nothing is installed, nothing is fetched, no wheel travels. The repo
# is imported as the `dspark` package through a link to it: setup.py maps the repo's folders onto dspark.*, and
# the repo root has no __init__.py, so the link is a namespace package. It prints one table within 8 minutes;
# arguments go to the check (--out DIR keeps the table as gpu_check.md and gpu_check.json).
# Without a CUDA device it is the dry run CI runs: each CUDA part is skipped with its reason.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${GPU_PYTHON:-python3}
if ! "$python" -c 'import torch, transformers' 2>/dev/null; then
    echo "gpu-check: $python cannot import torch and transformers; give GPU_PYTHON=<a python that can>" >&2
    exit 2
fi
package_root=$(mktemp -d)
trap 'rm -rf "$package_root"' EXIT
ln -s "$repo" "$package_root/dspark"
cd "$repo"
# the check keeps its own budget (--budget-s, 7 minutes); this only ends a hang
PYTHONPATH="$package_root${PYTHONPATH:+:$PYTHONPATH}" timeout 480 "$python" -m dspark.ops.harness.gpu_check "$@"
