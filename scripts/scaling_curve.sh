#!/usr/bin/env bash
# `make scaling-curve` (issue 45, item 6): SmolLM2 DSpark drafters trained on 0.1M, 0.5M and 2M reply tokens of the
# target's own replies, through the new pipeline, each evaluated decoded on held-out chat prompts; at 0.5M also a
# greedy-matched loss (replies at temperature 0) and DFlash / Eagle3 for the same training wall time as DSpark.
# Hours on 2 CPU cores: every step resumes (regenerate skips written conversations, dspark train --resume, the
# feature store finishes its shards), so run it in the background and run it again after an interruption.
#
# One rule for steps: 4 epochs of each subset at batch 4 (steps = 4 * conversations / 4), so more data is also more
# steps, as in DeepSpec's fixed-epoch recipe. Outputs: $work/<run>/ (drafters, train logs, TensorBoard) and
# bench/results/scaling/ (each eval JSON, scaling.json with acceptance by position against tokens, and the plot).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSPARK_CACHE:-$HOME/.cache/dspark}
dspark=$cache/venv/bin/dspark
python=$cache/venv/bin/python
target=$cache/targets/smollm2-135m-instruct
eval_prompts=${EVAL_PROMPTS:-$repo/../shared/data/eval_prompts}
work=$cache/scaling
results=$repo/bench/results/scaling
mkdir -p "$work" "$results"

# 1. Prompts in the target's own voice (dspark self-chat), then its replies through SGLang's Engine (CPU recipe).
[ -s "$work/prompts.jsonl" ] || "$dspark" self-chat --target "$target" --count 16000 --seed 0 --threads 2 \
    --out "$work/prompts.jsonl"
"$dspark" regenerate --input "$work/prompts.jsonl" --out "$work/replies.jsonl" --target "$target" --device cpu \
    --max-new-tokens 96 --concurrency 32
"$dspark" regenerate --input "$work/prompts.jsonl" --out "$work/replies-greedy.jsonl" --target "$target" \
    --device cpu --max-new-tokens 96 --concurrency 32 --temperature 0 --limit 6000

# 2. Nested subsets: the first conversations (in input order) whose replies reach each token count.
subset() {  # subset SOURCE TOKENS OUT -> prints the conversation count
    "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
source, tokens, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
records = sorted((json.loads(line) for line in open(source)), key=lambda r: r["index"])
total, kept = 0, []
for record in records:
    if total >= tokens:
        break
    kept.append(record)
    total += record["reply_tokens"]
if total < tokens:
    sys.exit(f"{source} holds {total} reply tokens, fewer than {tokens}: regenerate more prompts")
with open(out, "w") as sink:
    sink.writelines(json.dumps(r) + "\n" for r in kept)
print(len(kept))
PY
}

common=(--target "$target" --prompt-len 256 --response-len 96 --block-size 6 --target-layer-ids 2 15 27
        --mask-token-id 0 --init-from-target --loss-over-draft-vocab --n-anchors 48 --batch-size 4 --lr 1e-3
        --feature-cache "$cache/train-features" --eval-samples 32 --checkpoint-every 50 --log-every 10 --slim
        --threads 2 --resume)

train_and_eval() {  # train_and_eval NAME DATA STEPS EXTRA...
    local name=$1 data=$2 steps=$3
    shift 3
    "$dspark" train "${common[@]}" --data "$data" --steps "$steps" --eval-every $((steps / 5 > 0 ? steps / 5 : 1)) \
        --out "$work/$name" --work-dir "$work/$name-work" "$@"
    "$dspark" eval --target "$target" --drafter "$work/$name" --datasets "$eval_prompts/mt-bench.jsonl" \
        --limit 40 --max-new-tokens 96 --policy fixed --drafting always --no-baseline --threads 2 \
        --json "$results/$name.json"
}

for tokens in 100000 500000 2000000; do
    n=$(subset "$work/replies.jsonl" "$tokens" "$work/replies-$tokens.jsonl")
    train_and_eval "dspark-$tokens" "$work/replies-$tokens.jsonl" "$n" --drafter dspark
done

# 3. At 0.5M: the loss matched to greedy decoding (the target's greedy replies), and the three drafters for the same
# wall-clock training time as DSpark's (equal compute, not equal steps).
n=$(subset "$work/replies-greedy.jsonl" 500000 "$work/replies-greedy-500000.jsonl")
train_and_eval dspark-greedy-500000 "$work/replies-greedy-500000.jsonl" "$n" --drafter dspark
minutes=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'] / 60)" \
    "$work/dspark-500000/train_log.json")
n=$(subset "$work/replies.jsonl" 500000 "$work/replies-500000.jsonl")
# The schedule spans 10x the steps so that --minutes (DSpark's wall time) ends both runs: equal time, LR not decayed.
train_and_eval dflash-500000 "$work/replies-500000.jsonl" "$((n * 10))" --drafter dflash --num-layers 2 \
    --minutes "$minutes"
train_and_eval eagle3-500000 "$work/replies-500000.jsonl" "$((n * 10))" --drafter eagle3 --num-layers 1 \
    --minutes "$minutes"

# 4. The curve: acceptance by position against reply tokens (log x) and the tokens a 1.5x demo would need, by a
# straight-line fit of each position's acceptance against log10(tokens) (Scylla's log-linear growth).
"$python" "$repo/scripts/scaling_plot.py" --results "$results" --tokens 100000 500000 2000000 \
    --needed-acceptance "${NEEDED_ACCEPTANCE:-0.55}"
