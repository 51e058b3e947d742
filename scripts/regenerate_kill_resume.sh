#!/usr/bin/env bash
# A 200-prompt `dspark regenerate` through SGLang's offline Engine on CPU, killed midway and run again (issue 45's
# check): the second run must finish the rest, every prompt exactly once. Writes bench/results/regenerate/
# kill-resume-200.json. Usage: scripts/regenerate_kill_resume.sh [TARGET_DIR] (default: embedded/target).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSPARK_CACHE:-$HOME/.cache/dspark}
target=${1:-$repo/embedded/target}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cache/venv/bin/python" -c "
import json
with open('$work/prompts.jsonl', 'w') as f:
    for i in range(200):
        f.write(json.dumps({'prompt': f'def handler_{i}(request):'}) + '\n')"
run=("$cache/venv/bin/dspark" regenerate --input "$work/prompts.jsonl" --out "$work/out.jsonl" --target "$target"
     --device cpu --max-new-tokens 32 --concurrency 32 --no-progress)
setsid "${run[@]}" > "$work/first.log" 2>&1 &
first=$!
until [ -s "$work/out.jsonl" ] && [ "$(wc -l < "$work/out.jsonl")" -ge 60 ]; do
    kill -0 "$first" 2>/dev/null || { tail -20 "$work/first.log"; exit 1; }
    sleep 0.5
done
kill -KILL -- "-$first"
wait "$first" || true
before=$(wc -l < "$work/out.jsonl")
start=$(date +%s)
"${run[@]}" > "$work/second.log" 2>&1
after=$(wc -l < "$work/out.jsonl")
"$cache/venv/bin/python" - "$work/out.jsonl" "$before" "$after" "$(( $(date +%s) - start ))" "$(grep "^wrote" "$work/second.log" | tail -1 | sed "s#$work/##")" \
    "$repo/bench/results/regenerate/kill-resume-200.json" <<'PY'
import json, sys
out, before, after, seconds, summary, result = sys.argv[1:]
indices = [json.loads(line)["index"] for line in open(out)]
record = {"prompts": 200, "records_when_killed": int(before), "records_after_rerun": int(after),
          "every_prompt_exactly_once": sorted(indices) == list(range(200)), "rerun_wall_s_with_engine_start": int(seconds),
          "rerun_summary": summary, "command": "scripts/regenerate_kill_resume.sh"}
open(result, "w").write(json.dumps(record, indent=1) + "\n")
print(json.dumps(record, indent=1))
sys.exit(0 if record["every_prompt_exactly_once"] else 1)
PY
