#!/usr/bin/env bash
# `make soak`: serve the embedded target with DSpark (dspark serve, max 8 running requests), run `dspark soak`
# against it for SOAK_SECONDS with 4x that concurrency, then stop the server. Results: bench/results/soak/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dspark=${DSPARK_CACHE:-$HOME/.cache/dspark}/venv/bin/dspark
seconds=${SOAK_SECONDS:-180}
port=${SOAK_PORT:-30100}
admin_port=${SOAK_ADMIN_PORT:-50151}
work=$(mktemp -d)
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/admin-key"
# The admin key is also the gRPC admin API's admin token (file name "admin-key" is its caller name)
"$dspark" serve --target "$repo/embedded/target" --drafter "$repo/embedded/dspark" --port "$port" \
    --admin-port "$admin_port" --admin-token-file "$work/admin-key" \
    -- --max-running-requests 8 --sleep-on-idle > "$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$server" 2>/dev/null || { tail -40 "$work/serve.log"; exit 1; }
    sleep 2
done
"$dspark" soak --url "http://127.0.0.1:$port" --target "$repo/embedded/target" --admin-key-file "$work/admin-key" \
    --admin-address "127.0.0.1:$admin_port" --admin-token-file "$work/admin-key" \
    --duration "$seconds" --concurrency 32 --max-new-tokens 32 --out "$repo/bench/results/soak"
