#!/usr/bin/env bash
# `make gpu-check`: dspark's GPU check on a machine with one CUDA GPU (dspark gpu-check --help says what it runs).
#
# The Python it runs under, first that applies:
#   GPU_PYTHON=/path/to/python   an interpreter that already has CUDA torch 2.14.1, triton, flashinfer-python
#                                0.7.2 and sglang 0.5.23 (with sglang-kernel)
#   GPU_WHEELS=/dir/of/wheels    a venv in $DSPARK_CACHE/gpu-venv installed from those wheels alone (no index)
#   python3                      the machine's own
# dspark itself is installed editable into it (no dependencies). Output: bench/results/gpu-check/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSPARK_CACHE:-$HOME/.cache/dspark}
python=${GPU_PYTHON:-}
if [ -z "$python" ] && [ -n "${GPU_WHEELS:-}" ]; then
    venv=$cache/gpu-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-index --find-links "$GPU_WHEELS" "torch==2.14.1" triton \
        "flashinfer-python==0.7.2" "sglang==0.5.23" "transformers==5.19.0" pytest scipy safetensors matplotlib tqdm
    python=$venv/bin/python
fi
python=${python:-python3}
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: $python has no CUDA torch (or sees no GPU). Give GPU_PYTHON=<python with CUDA torch 2.14.1," \
         "triton, flashinfer-python 0.7.2, sglang 0.5.23> or GPU_WHEELS=<a folder of those wheels>." >&2
    exit 2
fi
"$python" -m pip install --quiet --no-deps --no-build-isolation -e "$repo" >/dev/null
cd "$repo"
exec timeout 600 "$python" -m dspark.ops.cli gpu-check --out "$repo/bench/results/gpu-check" "$@"
