#!/usr/bin/env bash
# `make scaling-curve` (issue 45, item 6): SmolLM2 DSpark drafters trained on nested subsets of the target's own
# replies (SIZES reply tokens), through the new pipeline, each evaluated decoded on held-out chat prompts; at one
# size (GREEDY_LOSS_AT) also the greedy-matched loss (--loss greedy) on the same data; at the COMPARE_AT sizes,
# DFlash and Eagle3 for the same training wall time as DSpark's; the demo's drafter on the same prompts. Every step resumes (regenerate
# skips written conversations, dspark train --resume, the feature store finishes its shards, finished runs and
# evaluations are skipped), so run it in the background and run it again after an interruption. A run whose eval
# JSON and train log are already under bench/results/scaling/ is not run again, so a larger size can be added to
# the committed curve (with DSPARK_CACHE on a disk that outlives the session).
#
# The defaults are the run committed under bench/results/scaling/ (about 3.5 hours on 2 cores: 1600 self-chat
# prompts, ~140K reply tokens, at most 126K of them trained on). SIZES="100000 500000 2000000" PROMPTS=25000 is
# the issue's curve: about a day here.
# One rule for steps: EPOCHS passes over each subset at batch 4 (steps = EPOCHS * conversations / 4), so more data
# is also more steps, as in DeepSpec's fixed-epoch recipe. Outputs: $work/<run>/ (drafters, train logs,
# TensorBoard) and bench/results/scaling/ (each eval JSON and train log, scaling.json, the plot).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSPARK_CACHE:-$HOME/.cache/dspark}
dspark=$cache/venv/bin/dspark
python=$cache/venv/bin/python
target=$cache/targets/smollm2-135m-instruct
eval_prompts=${EVAL_PROMPTS:-$repo/../shared/data/eval_prompts}
work=$cache/scaling
results=$repo/bench/results/scaling
read -r -a sizes <<< "${SIZES:-14000 42000 126000}"
prompts=${PROMPTS:-1600}
epochs=${EPOCHS:-2}
eval_limit=${EVAL_LIMIT:-32}
mkdir -p "$work" "$results"

# 1. Prompts in the target's own voice (dspark self-chat: resumes, and does nothing once complete), then its replies
# through SGLang's Engine (CPU recipe).
"$dspark" self-chat --target "$target" --count "$prompts" --max-tokens 64 --seed 0 \
    --threads 2 --out "$work/prompts.jsonl"
[ -s "$work/replies.jsonl" ] && [ "$(wc -l < "$work/replies.jsonl")" -ge "$(wc -l < "$work/prompts.jsonl")" ] ||
    "$dspark" regenerate --input "$work/prompts.jsonl" --out "$work/replies.jsonl" --target "$target" --device cpu \
        --max-new-tokens 96 --concurrency 32

# 2. Nested subsets: the first training conversations (in input order) whose replies reach each token count, plus
# every held-out conversation of the whole file. dspark train splits by a hash of the first user turn, so those
# never train, and every size is checked on the same held-out prompts. Prints the training conversations' count.
subset() {  # subset SOURCE TOKENS OUT
    "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
from dspark.models.embedded_target.corpus import DEFAULT_HELD_OUT_PERCENT, is_held_out
source, tokens, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
records = sorted((json.loads(line) for line in open(source)), key=lambda r: r["index"])
first_turn = lambda r: next(m["content"] for m in r["messages"] if m["role"] == "user")
held_out = [r for r in records if is_held_out(first_turn(r), DEFAULT_HELD_OUT_PERCENT)]
total, kept = 0, []
for record in (r for r in records if not is_held_out(first_turn(r), DEFAULT_HELD_OUT_PERCENT)):
    if total >= tokens:
        break
    kept.append(record)
    total += record["reply_tokens"]
if total < tokens:
    sys.exit(f"{source} holds {total} training reply tokens, fewer than {tokens}: regenerate more prompts")
with open(out, "w") as sink:
    sink.writelines(json.dumps(r) + "\n" for r in kept + held_out)
print(len(kept))
PY
}

common=(--target "$target" --prompt-len 256 --response-len 96 --block-size 6 --target-layer-ids 2 15 27
        --mask-token-id 0 --init-from-target --n-anchors 48 --batch-size 4 --lr 1e-3
        --feature-cache "$cache/train-features" --eval-samples 32 --checkpoint-every 50 --log-every 10 --slim
        --threads 2 --resume)
# Every drafter's logits and loss over its draft vocabulary (Eagle3's committed 14K and 126K runs predate its
# --loss-over-draft-vocab and trained over the full vocabulary).
draft_vocab=(--loss-over-draft-vocab)

# Greedy decoding, as `make demo` decodes (and so the acceptance it needs is comparable), every draft verified.
eval_args=(--target "$target" --datasets "$eval_prompts/mt-bench.jsonl" --limit "$eval_limit" --max-new-tokens 96
           --temperature 0 --policy fixed --drafting always --no-baseline --threads 2)

train_and_eval() {  # train_and_eval NAME DATA STEPS EXTRA... (a run whose results are committed is kept as it is)
    local name=$1 data=$2 steps=$3
    shift 3
    [ -s "$results/$name.json" ] && [ -s "$results/$name.train_log.json" ] && return
    [ -s "$work/$name/train_log.json" ] || "$dspark" train "${common[@]}" --data "$data" --steps "$steps" \
        --eval-every $((steps / 5 > 0 ? steps / 5 : 1)) --out "$work/$name" --work-dir "$work/$name-work" "$@"
    cp "$work/$name/train_log.json" "$results/$name.train_log.json"
    [ -s "$results/$name.json" ] || "$dspark" eval --drafter "$work/$name" "${eval_args[@]}" --json "$results/$name.json"
}
steps_for() { echo $(( $1 * epochs / 4 > 0 ? $1 * epochs / 4 : 1 )); }  # steps_for CONVERSATIONS

for tokens in "${sizes[@]}"; do
    n=$(subset "$work/replies.jsonl" "$tokens" "$work/replies-$tokens.jsonl")
    train_and_eval "dspark-$tokens" "$work/replies-$tokens.jsonl" "$(steps_for "$n")" --drafter dspark \
        "${draft_vocab[@]}"
done

# 3. At GREEDY_LOSS_AT reply tokens (default the smallest size), the greedy-matched loss (--loss greedy) on the
# same replies and steps as DSpark's. At each COMPARE_AT size, DFlash and Eagle3 for DSpark's training wall time
# there (equal compute, not equal steps). Their schedules span 10x DSpark's steps so that --minutes ends them:
# equal time, their learning rate not yet decayed.
greedy_at=${GREEDY_LOSS_AT:-${sizes[0]}}
n=$(subset "$work/replies.jsonl" "$greedy_at" "$work/replies-$greedy_at.jsonl")
train_and_eval "dspark-greedy-loss-$greedy_at" "$work/replies-$greedy_at.jsonl" "$(steps_for "$n")" --drafter dspark \
    "${draft_vocab[@]}" --loss greedy
read -r -a compare_sizes <<< "${COMPARE_AT:-14000 126000}"
for compare in "${compare_sizes[@]}"; do
    n=$(subset "$work/replies.jsonl" "$compare" "$work/replies-$compare.jsonl")
    minutes=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'] / 60)" \
        "$results/dspark-$compare.train_log.json")
    train_and_eval "dflash-$compare" "$work/replies-$compare.jsonl" "$(( $(steps_for "$n") * 10 ))" --drafter dflash \
        "${draft_vocab[@]}" --num-layers 2 --minutes "$minutes"
    train_and_eval "eagle3-$compare" "$work/replies-$compare.jsonl" "$(( $(steps_for "$n") * 10 ))" --drafter eagle3 \
        "${draft_vocab[@]}" --num-layers 1 --minutes "$minutes"
done

# 4. The demo's drafter on the same prompts, for scale.
[ -s "$results/demo-drafter.json" ] || "$dspark" eval --drafter "$repo/embedded/smollm2-dspark-regen" \
    "${eval_args[@]}" --json "$results/demo-drafter.json"

# 5. The curve: acceptance by position against reply tokens (log x) and the tokens a 1.5x demo would need, by a
# straight-line fit of each position's acceptance against log10(tokens) (Scylla's log-linear growth).
# 0.54: the acceptance at every position the demo needs for 1.5x (bench/results/demo/speedup-bound/demo.json).
"$python" "$repo/scripts/scaling_plot.py" --results "$results" --tokens "${sizes[@]}" \
    --needed-acceptance "${NEEDED_ACCEPTANCE:-0.54}"
