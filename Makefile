# dspark: every target sets up its own environment first (scripts/setup_env.sh is idempotent).
DSPARK_CACHE ?= $(HOME)/.cache/dspark
export DSPARK_CACHE
PY := $(DSPARK_CACHE)/venv/bin/python
DSPARK := $(DSPARK_CACHE)/venv/bin/dspark

.PHONY: setup test demo serve proto chart-schema bench bench-sched bench-sched-smollm2 bench-serve bench-trace soak gpu-check embedded-target drafters embedded-models

setup:
	bash scripts/setup_env.sh

# k8s-tools: helm, kubectl and a v1.20.2 API server for tests/helm (built once: ~6 min on 2 idle cores; cached in
# $(DSPARK_CACHE)/k8s). On a fresh machine it builds at the lowest CPU priority beside pytest, which runs the chart's
# tests last (tests/conftest.py): the build takes the cores the SGLang servers leave idle, and the chart's fixtures
# wait for it (scripts/setup_k8s_tools.sh holds a lock while it builds). Its log: $(DSPARK_CACHE)/k8s-tools.log.
test: setup
	@mkdir -p $(DSPARK_CACHE)/k8s
	nice -n 19 bash scripts/setup_k8s_tools.sh > $(DSPARK_CACHE)/k8s-tools.log 2>&1 & tools=$$!; \
	$(PY) -m pytest; status=$$?; \
	wait $$tools || { echo "k8s-tools failed (the chart's tests said so too):"; tail -n 20 $(DSPARK_CACHE)/k8s-tools.log; }; \
	exit $$status

# The main job: SmolLM2-135M-Instruct answers a few chat prompts on CPU, with and without its DSpark drafter
# (identical greedy answers; prints the text, tau, the speedup and the acceptance this machine's costs need; plots
# and JSON under out/demo).
demo: setup
	$(DSPARK) demo --target $(SMOLLM2) --drafter embedded/smollm2-dspark-regen --out out/demo

# Serve the embedded default through SGLang (DSpark + dspark's plugin; on CPU the CPU recipe) on port 30000.
serve: setup
	$(DSPARK) serve --target embedded/target --drafter embedded/dspark --port 30000

# Regenerate the admin API: the proto's Settings message from the settings schema (models/decoding/settings.py),
# then the gRPC code (ops/admin/v1/admin_pb2*.py, committed) from admin.proto.
proto: setup
	$(PY) scripts/gen_proto.py

# Regenerate the chart's generated values and schema (settings, requestLimits) from their one definitions.
chart-schema: setup
	$(PY) scripts/gen_chart_schema.py

# tau per dataset (math / code / chat) for DSpark, DFlash and Eagle3, and greedy tokens/s against no speculation
# at batch 1 and 8, for both targets: bench/results/{embedded,smollm2}/ (bench.json, bench.md, plots).
# Run it on an otherwise idle machine: it measures wall-clock speed.
EVAL_PROMPTS ?= ../shared/data/eval_prompts
BENCH_SETTINGS ?= --datasets math=$(EVAL_PROMPTS)/gsm8k.jsonl code=$(EVAL_PROMPTS)/humaneval.jsonl \
	chat=$(EVAL_PROMPTS)/mt-bench.jsonl --prompts 12 --max-new-tokens 96 --tau-batch-size 12 \
	--speed-tokens 64 --batch-sizes 1 8 --threads 2
# The embedded target decodes 32 prompts a repeat (4 batches at batch 8: one batch of it lasts under a second, too
# short to average out the machine's drift); SmolLM2, 25 times slower, 8.
bench: setup
	$(DSPARK) bench --target embedded/target --name embedded-target $(BENCH_SETTINGS) --speed-prompts 32 \
		--out bench/results/embedded --drafters dspark=embedded/dspark dflash=embedded/dflash eagle3=embedded/eagle3
	@for d in dspark dflash eagle3 dspark-long dflash-long eagle3-long; do [ -d $(RETIRED)/smollm2-$$d ] || { \
		echo "make bench: $(RETIRED)/smollm2-$$d is missing: make smollm2-drafters smollm2-long-drafters"; exit 2; }; done
	$(DSPARK) bench --target $(SMOLLM2) --name smollm2-135m-instruct $(BENCH_SETTINGS) --speed-prompts 8 \
		--out bench/results/smollm2 \
		--drafters dspark=$(RETIRED)/smollm2-dspark dflash=$(RETIRED)/smollm2-dflash eagle3=$(RETIRED)/smollm2-eagle3 \
		dspark-long=$(RETIRED)/smollm2-dspark-long dflash-long=$(RETIRED)/smollm2-dflash-long \
		eagle3-long=$(RETIRED)/smollm2-eagle3-long

# Allocation policies under load (issue 4): the embedded target saturates 2 cores inside concurrency 1..64.
bench-sched: setup
	$(DSPARK) bench-sched --target embedded/target --drafter embedded/dspark \
		--prompts-file $(EVAL_PROMPTS)/humaneval.jsonl --limit 32 --concurrency 1 2 4 8 16 32 64 \
		--simulate-to 1024 --max-new-tokens 48 --threads 2 --out bench/results/sched

# The same on SmolLM2-135M-Instruct, whose verify forward dominates a round on this CPU (the embedded target's
# drafter costs about as much as the target itself, so no allocation policy can change its goodput much).
# About 70 minutes on two idle cores (the SPS profile up to 224 tokens, then 3 repeats of 24 runs: no-spec and 7
# policies at concurrency 1, 8 and 32; 64 requests at 32).
bench-sched-smollm2: setup
	$(DSPARK) bench-sched --target $(SMOLLM2) --drafter embedded/smollm2-dspark-regen \
		--prompts-file $(EVAL_PROMPTS)/mt-bench.jsonl --limit 8 --concurrency 1 8 32 \
		--simulate-to 1024 --max-new-tokens 48 --threads $(BENCH_SCHED_THREADS) --out bench/results/sched-smollm2
BENCH_SCHED_THREADS ?= 2

# The float32 linears probed per shape and row count against PyTorch's default on this CPU
# (models/decoding/cpu_linears.py): the target's verify cost curve, and the demo with drafting forced on (all 6
# drafts verified) for DSpark and Eagle3 of the longer recipe, each with --cpu-linears auto and default.
.PHONY: bench-cpu-linears
bench-cpu-linears: setup
	for linears in auto default; do \
		$(DSPARK) profile-sps --target $(SMOLLM2) --cpu-linears $$linears --threads 2 \
			--out bench/results/cpu-linears/sps-$$linears.json && \
		for drafter in dspark-long eagle3-long; do \
			$(DSPARK) demo --target $(SMOLLM2) --drafter $(RETIRED)/smollm2-$$drafter --policy fixed \
				--drafting always --cpu-linears $$linears --threads 2 \
				--out bench/results/cpu-linears/$$linears/$$drafter || exit 1; \
		done || exit 1; \
	done

# DSpark served by the real SGLang server (with dspark's plugin) against the target alone, both targets:
# tokens/s, tau and verify budget at concurrency 1 and 8, policies switched live: bench/results/serve-*/.
bench-serve: setup
	$(DSPARK) bench-serve --target embedded/target --drafter embedded/dspark \
		--prompts-file $(EVAL_PROMPTS)/humaneval.jsonl --limit 8 --max-new-tokens 32 --concurrency 1 8 \
		--policies causal fixed mtp1 --drafting always auto --out bench/results/serve-embedded
	$(DSPARK) bench-serve --target $(SMOLLM2) --drafter embedded/smollm2-dspark-regen \
		--prompts-file $(EVAL_PROMPTS)/mt-bench.jsonl --limit 8 --max-new-tokens 32 --concurrency 1 8 \
		--policies causal fixed mtp1 --drafting always auto --out bench/results/serve-smollm2

# What tracing costs: a traced and an untraced DSpark server alternated in one run (docs/observability.md).
bench-trace: setup
	$(DSPARK) bench-trace --target embedded/target --drafter embedded/dspark \
		--prompts-file $(EVAL_PROMPTS)/humaneval.jsonl --limit 8 --max-new-tokens 48 --concurrency 4 --repeats 6 \
		--out bench/results/trace-overhead

# A load-and-fault soak of the served stack (issue 17): greedy answers checked against the target alone, sampled
# and streamed calls, prompts beyond the context, disconnects, malformed bodies and live state changes (over HTTP
# and the gRPC admin API) at 32 clients (4x the server's 8 running requests). SOAK_SECONDS=600 for the
# run docs/serving.md quotes: bench/results/soak/.
soak: setup
	bash scripts/soak.sh

# The first thing to run on a lent GPU machine, <= 8 minutes, one table (docs/kernels.md#the-gpu-check): the Triton
# kernels against their references with timings, FlashInfer (or why not), the engine decoding the embedded target
# with its DSpark drafter (identical greedy output, speedup, tau) and a training step's throughput. No `setup`: it
# runs from the repo as sent under the machine's own python (GPU_PYTHON) with its torch, Triton and transformers.
# Without a GPU it is the dry run CI runs (tests/ops/commands/test_gpu_check_command.py).
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= bench/results/gpu-check
gpu-check:
	GPU_PYTHON=$(GPU_PYTHON) bash scripts/gpu_check.sh --out $(GPU_CHECK_OUT)

# Reproduce the committed embedded models (see the cards in embedded/*/README.md).
embedded-models: embedded-target drafters

# The committed target (embedded/target/README.md): 40 min on 2 cores.
embedded-target: setup
	$(DSPARK) embedded-target --out embedded/target --minutes 40 --seed 0 --lr 3e-3 --warmup-steps 50 \
		--threads 2 --eval-every 100

# The committed drafters (embedded/{dspark,dflash,eagle3}/README.md): same data and steps; on 2 cores
# generating the data takes 10-25 min, then DSpark and DFlash ~8 min each, Eagle3 ~18 min.
DRAFTER_RECIPE := --target embedded/target --slim --block-size 5 --target-layer-ids 0 1 2 --num-samples 4096 \
	--prompt-len 32 --response-len 128 --n-anchors 32 --batch-size 8 --steps 400 --lr 5e-3 \
	--checkpoint-every 100 --eval-samples 64 --threads 1 --log-every 10
drafters: setup
	$(DSPARK) train $(DRAFTER_RECIPE) --drafter dspark --markov-head vanilla --markov-rank 64 --num-layers 2 \
		--out embedded/dspark --work-dir $(DSPARK_CACHE)/train-work/dspark
	$(DSPARK) train $(DRAFTER_RECIPE) --drafter dflash --num-layers 2 \
		--out embedded/dflash --work-dir $(DSPARK_CACHE)/train-work/dflash
	$(DSPARK) train $(DRAFTER_RECIPE) --drafter eagle3 --num-layers 1 \
		--out embedded/eagle3 --work-dir $(DSPARK_CACHE)/train-work/eagle3

# Drafters for SmolLM2-135M-Instruct (provided by `make setup` under $(DSPARK_CACHE)/targets). Only the demo's
# (embedded/smollm2-dspark-regen, the last recipe below) is committed; the others are retired from the tree (their
# cards and logs: bench/results/retired-drafters/) and these recipes build them slim (no copies of the target's
# embedding / lm_head) into $(RETIRED), where `make bench` and bench-cpu-linears read them. Same data for all
# three (the target's own replies to 960 built-in chat prompts, generated once by the first command and cached,
# with the target's outputs on them cached beside it) and the same budget (1000 optimizer steps of 4 sequences,
# 16 anchor blocks each). Why these levers, with their measured s/step: bench/results/retired-drafters/smollm2-dspark/README.md. On the
# shared 2-core CPU with one thread: data ~15 min, features ~2 min, then ~45 min for DSpark, ~20 for DFlash and
# ~90 for Eagle3 (its 6 test-time-training steps). Interrupted? Run it again: every command resumes from its
# last checkpoint.
SMOLLM2 := $(DSPARK_CACHE)/targets/smollm2-135m-instruct
RETIRED := $(DSPARK_CACHE)/drafters
SMOLLM2_TRAIN := --target $(SMOLLM2) --data-source chat --prompt-len 128 --response-len 64 \
	--eval-samples 32 --data-cache $(DSPARK_CACHE)/train-data --feature-cache $(DSPARK_CACHE)/train-features \
	--bf16 --init-from-target --block-size 6 --target-layer-ids 2 15 27 --mask-token-id 0 --batch-size 4 \
	--lr 1e-3 --checkpoint-every 50 --log-every 10 --slim --resume
SMOLLM2_RECIPE := $(SMOLLM2_TRAIN) --num-samples 960 --n-anchors 16 --steps 1000 --threads 1
SMOLLM2_DSPARK := --drafter dspark --markov-head vanilla --markov-rank 64 --num-layers 2
.PHONY: smollm2-drafters
smollm2-drafters: setup
	$(DSPARK) train $(SMOLLM2_RECIPE) $(SMOLLM2_DSPARK) \
		--out $(RETIRED)/smollm2-dspark --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark
	$(DSPARK) train $(SMOLLM2_RECIPE) --drafter dflash --num-layers 2 \
		--out $(RETIRED)/smollm2-dflash --work-dir $(DSPARK_CACHE)/train-work/smollm2-dflash
	$(DSPARK) train $(SMOLLM2_RECIPE) --drafter eagle3 --num-layers 1 \
		--out $(RETIRED)/smollm2-eagle3 --work-dir $(DSPARK_CACHE)/train-work/smollm2-eagle3

# The longer recipe: 3x the replies (2880), 3x the anchors per sequence (48) and twice the steps (2000), on two
# threads, for all three drafters. Its DSpark drafter is the one `make demo` and bench-sched-smollm2 use. Wall time
# on the 2 idle cores: replies 14.5 min and features 2 min (shared, cached), then training DSpark 50 min, DFlash
# 45 min, Eagle3 38.5 min (their cards). `make bench` adds them as the rows dspark-long, dflash-long, eagle3-long.
SMOLLM2_LONG := $(SMOLLM2_TRAIN) --num-samples 2880 --n-anchors 48 --steps 2000 --threads 2
.PHONY: smollm2-long-drafters
smollm2-long-drafters: setup
	$(DSPARK) train $(SMOLLM2_LONG) $(SMOLLM2_DSPARK) \
		--out $(RETIRED)/smollm2-dspark-long --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-long
	$(DSPARK) train $(SMOLLM2_LONG) --drafter dflash --num-layers 2 \
		--out $(RETIRED)/smollm2-dflash-long --work-dir $(DSPARK_CACHE)/train-work/smollm2-dflash-long
	$(DSPARK) train $(SMOLLM2_LONG) --drafter eagle3 --num-layers 1 \
		--out $(RETIRED)/smollm2-eagle3-long --work-dir $(DSPARK_CACHE)/train-work/smollm2-eagle3-long

# The longer recipe's DSpark drafter fine-tuned to users' questions: SmolLM2 writes 1920 user turns itself
# (`dspark self-chat`, models/training/self_chat.py; float32, seed 0), answers 1600 of them (T 0.7), and the
# drafter trains on those replies from its own weights (--init-from-drafter), in float32 (no native bf16 here).
# Wall time on the 2 cores: prompts 25 min, replies 16 min, features 5 min, training 37 min (its card).
SMOLLM2_SELF_CHAT := $(DSPARK_CACHE)/self-chat/smollm2-1920.jsonl
.PHONY: smollm2-self-chat
smollm2-self-chat: setup  # always run: it resumes a cut file, and does nothing once it holds 1920 turns
	$(DSPARK) self-chat --target $(SMOLLM2) --count 1920 --seed 0 --threads 2 --out $(SMOLLM2_SELF_CHAT)
SMOLLM2_CHAT := $(filter-out --bf16 --init-from-target,$(SMOLLM2_TRAIN)) --prompts-file $(SMOLLM2_SELF_CHAT) \
	--builtin-prompts 0 --num-samples 1600 --n-anchors 48 --steps 500 --lr 5e-4 --threads 2 \
	--init-from-drafter $(RETIRED)/smollm2-dspark-long
.PHONY: smollm2-chat-drafter
smollm2-chat-drafter: smollm2-self-chat
	$(DSPARK) train $(SMOLLM2_CHAT) $(SMOLLM2_DSPARK) \
		--out $(RETIRED)/smollm2-dspark-chat --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-chat

# That drafter trained 2000 steps further on the same replies with its logits and loss over its draft vocabulary
# (--loss-over-draft-vocab, models/training/losses.py): 1.6-2 s a step instead of ~3.5-4.5; 68 min on the 2 cores.
# The later options override SMOLLM2_CHAT's (argparse keeps the last).
.PHONY: smollm2-chat-vocab-drafter
smollm2-chat-vocab-drafter: smollm2-self-chat
	$(DSPARK) train $(SMOLLM2_CHAT) $(SMOLLM2_DSPARK) --steps 2000 --loss-over-draft-vocab \
		--init-from-drafter $(RETIRED)/smollm2-dspark-chat \
		--out $(RETIRED)/smollm2-dspark-chat-vocab --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-chat-vocab

# That drafter trained 1500 steps further on fresh replies: --data-seed 43 draws 1600 of the self-chat turns anew
# (most of them the same turns, none held out) and samples every reply anew, so the drafter sees new replies rather
# than a third pass over the same 1600. Replies 30 min, features 6 min, training 61 min on the 2 cores.
.PHONY: smollm2-chat-more-drafter
smollm2-chat-more-drafter: smollm2-self-chat
	$(DSPARK) train $(SMOLLM2_CHAT) $(SMOLLM2_DSPARK) --steps 1500 --loss-over-draft-vocab --data-seed 43 \
		--init-from-drafter $(RETIRED)/smollm2-dspark-chat-vocab \
		--out $(RETIRED)/smollm2-dspark-chat-more --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-chat-more

# That drafter trained 1000 steps further on the target's greedy replies (--temperature 0), 96 tokens long instead of
# 64: what greedy decoding (make demo, the speed benchmarks) and the held-out check verify against, as far into a
# reply as the demo's answers go. Greedy replies to a prompt are one reply, so this is 1600 new samples, not more.
# On the 2-core EPYC with avx512_bf16 (float32): replies 20 min, features 7 min, training 27 min.
.PHONY: smollm2-chat-greedy-drafter
smollm2-chat-greedy-drafter: smollm2-self-chat
	$(DSPARK) train $(SMOLLM2_CHAT) $(SMOLLM2_DSPARK) --steps 1000 --loss-over-draft-vocab --temperature 0 \
		--response-len 96 --init-from-drafter $(RETIRED)/smollm2-dspark-chat-more \
		--out $(RETIRED)/smollm2-dspark-chat-greedy --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-chat-greedy

# The draft vocabulary beside every SmolLM2 drafter (draft_vocab.json; models/drafters/draft_vocab.py): the 8192
# most frequent tokens of the target's float32 replies to the longer recipe's 2880 training prompts (generated once
# and cached: ~30 min on the 2 cores without native bf16, where the recipe's own bf16 replies would take hours). A
# drafter trained from now on gets one from its own training data.
SMOLLM2_VOCAB_DATA := $(filter-out --bf16,$(SMOLLM2_TRAIN)) --num-samples 2880 --threads 2
.PHONY: smollm2-draft-vocabs
smollm2-draft-vocabs: setup
	for drafter in dspark dflash eagle3 dspark-long dflash-long eagle3-long; do \
		$(DSPARK) train $(SMOLLM2_VOCAB_DATA) --drafter dspark --only-draft-vocab \
			--out $(RETIRED)/smollm2-$$drafter || exit 1; \
	done

# The data-scaling curve of issue 45 (item 6): SmolLM2 DSpark drafters on nested subsets of replies regenerated
# through SGLang (SIZES, default 14K/42K/126K reply tokens), decoded acceptance by position against tokens, the tokens
# a 1.5x demo would need; the greedy-matched loss, DFlash and Eagle3 beside them. ~3.5 h on 2 cores; every stage
# resumes (scripts/scaling_curve.sh says what).
.PHONY: scaling-curve
scaling-curve: setup
	scripts/scaling_curve.sh

# The self-chat regen drafter (retired: bench/results/retired-drafters/smollm2-dspark-regen-selfchat; the demo's
# until the one below): the chat-vocab drafter trained 2 epochs (760 steps at batch 4) further through the new
# pipeline, on the 1,515 training conversations `make scaling-curve` regenerated through SGLang (its first stage
# writes the file; 137,919 reply tokens), from the sharded feature store, its loss over those replies' draft
# vocabulary; the held-out check every 152 steps keeps the best (step 608). Features 6.5 min and training 19 min on
# the 2 cores.
SCALING_REPLIES := $(DSPARK_CACHE)/scaling/replies.jsonl
# What the regen fine-tunes below share: the demo drafter's shape, its loss over the draft vocabulary, the batch.
REGEN_FINE_TUNE := $(SMOLLM2_DSPARK) --block-size 6 --target-layer-ids 2 15 27 --mask-token-id 0 \
	--loss-over-draft-vocab --prompt-len 256 --response-len 96 --n-anchors 48 --batch-size 4 --lr 5e-4 \
	--eval-samples 32 --checkpoint-every 50 --log-every 10 --slim --save-dtype bfloat16 --threads 2 --resume
# How they regenerate replies: SGLang's Engine on this CPU, DeepSpec's sampling, at most 96 tokens.
REGENERATE_CPU := --target $(SMOLLM2) --device cpu --max-new-tokens 96 --concurrency 32
.PHONY: smollm2-regen-selfchat-drafter
smollm2-regen-selfchat-drafter: setup
	@test -s $(SCALING_REPLIES) || { echo "$(SCALING_REPLIES) is missing: make scaling-curve regenerates it"; exit 1; }
	$(DSPARK) train --target $(SMOLLM2) --data $(SCALING_REPLIES) $(REGEN_FINE_TUNE) \
		--init-from-drafter $(RETIRED)/smollm2-dspark-chat-vocab --steps 760 --eval-every 152 \
		--feature-cache $(DSPARK_CACHE)/train-features \
		--out $(RETIRED)/smollm2-dspark-regen-selfchat --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-regen-selfchat

# The template regen drafter (retired: bench/results/retired-drafters/smollm2-dspark-regen-templates; the demo's
# until the one below): that drafter trained one epoch (850 steps at batch 4) further on fresh replies: SmolLM2's
# own, regenerated through SGLang's Engine (DeepSpec's sampling, at most 96 tokens), to a new draw of the built-in
# chat prompts (`dspark chat-prompts` seed 8: math, code and general templates; none equal or near an eval or demo
# prompt). Its run was cut at 3,580 conversations (324,015 reply tokens; 62 min at 87 tokens/s); target features
# online; the held-out check every 170 steps keeps the best. Training 58 min on the 2 cores. Interrupted? Run it
# again: regenerate and train resume.
TEMPLATE_PROMPTS := $(DSPARK_CACHE)/regen-templates/prompts.jsonl
TEMPLATE_REPLIES := $(DSPARK_CACHE)/regen-templates/replies.jsonl
TEMPLATE_LIMIT := 3580
.PHONY: smollm2-regen-templates-drafter
smollm2-regen-templates-drafter: setup
	$(DSPARK) chat-prompts --count 5000 --seed 8 --out $(TEMPLATE_PROMPTS)
	$(DSPARK) regenerate --input $(TEMPLATE_PROMPTS) --out $(TEMPLATE_REPLIES) $(REGENERATE_CPU) \
		--limit $(TEMPLATE_LIMIT)
	$(DSPARK) train --target $(SMOLLM2) --data $(TEMPLATE_REPLIES) $(REGEN_FINE_TUNE) \
		--init-from-drafter $(RETIRED)/smollm2-dspark-regen-selfchat --steps 850 --eval-every 170 \
		--out $(RETIRED)/smollm2-dspark-regen-templates --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-regen-templates

# The rest regen drafter (retired: bench/results/retired-drafters/smollm2-dspark-regen-rest; the demo's until the one
# below): that drafter trained one epoch (335 steps at batch 4) further on the replies to the other 1,420 prompts of
# the same draw (127,904 reply tokens; 24 min at 90 tokens/s), keeping its draft vocabulary (--init-from-drafter
# does); features online; training 21 min on the 2 cores. The greedy-matched loss on the same replies did no better
# (bench/results/smollm2/fresh-replies-loss/).
REST_PROMPTS := $(DSPARK_CACHE)/regen-templates/prompts-rest.jsonl
REST_REPLIES := $(DSPARK_CACHE)/regen-templates/replies-rest.jsonl
.PHONY: smollm2-regen-rest-drafter
smollm2-regen-rest-drafter: setup
	@test -s $(RETIRED)/smollm2-dspark-regen-templates/model.safetensors || \
		{ echo "$(RETIRED)/smollm2-dspark-regen-templates is missing: make smollm2-regen-templates-drafter"; exit 1; }
	tail -n +$$(( $(TEMPLATE_LIMIT) + 1 )) $(TEMPLATE_PROMPTS) > $(REST_PROMPTS)
	$(DSPARK) regenerate --input $(REST_PROMPTS) --out $(REST_REPLIES) $(REGENERATE_CPU)
	$(DSPARK) train --target $(SMOLLM2) --data $(REST_REPLIES) $(REGEN_FINE_TUNE) \
		--init-from-drafter $(RETIRED)/smollm2-dspark-regen-templates --steps 335 --eval-every 335 \
		--out $(RETIRED)/smollm2-dspark-regen-rest --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-regen-rest

# The seed-9 regen drafter (retired: bench/results/retired-drafters/smollm2-dspark-regen-seed9; the demo's until the
# one below): that drafter trained one epoch (619 steps at batch 4) further on replies to a second draw of the
# built-in chat prompts (`dspark chat-prompts` seed 9, less the 1,101 prompts seed 8 also drew; the first 2,600 of
# the rest: 237,420 reply tokens in 53 min at 74 tokens/s), keeping its draft vocabulary; features online; training
# 41 min on the 2 cores.
SEED9_ALL := $(DSPARK_CACHE)/regen-templates/prompts-seed9-all.jsonl
SEED9_PROMPTS := $(DSPARK_CACHE)/regen-templates/prompts-seed9.jsonl
SEED9_REPLIES := $(DSPARK_CACHE)/regen-templates/replies-seed9.jsonl
.PHONY: smollm2-regen-seed9-drafter
smollm2-regen-seed9-drafter: setup
	@test -s $(RETIRED)/smollm2-dspark-regen-rest/model.safetensors || \
		{ echo "$(RETIRED)/smollm2-dspark-regen-rest is missing: make smollm2-regen-rest-drafter"; exit 1; }
	$(DSPARK) chat-prompts --count 5000 --seed 8 --out $(TEMPLATE_PROMPTS)
	$(DSPARK) chat-prompts --count 5000 --seed 9 --out $(SEED9_ALL)
	grep -vxF -f $(TEMPLATE_PROMPTS) $(SEED9_ALL) > $(SEED9_PROMPTS)
	$(DSPARK) regenerate --input $(SEED9_PROMPTS) --out $(SEED9_REPLIES) $(REGENERATE_CPU) --limit 2600
	$(DSPARK) train --target $(SMOLLM2) --data $(SEED9_REPLIES) $(REGEN_FINE_TUNE) \
		--init-from-drafter $(RETIRED)/smollm2-dspark-regen-rest --steps 619 --eval-every 619 \
		--out $(RETIRED)/smollm2-dspark-regen-seed9 --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-regen-seed9

# The demo's drafter (embedded/smollm2-dspark-regen, issue 45 item 7): that drafter trained one epoch (1,404 steps
# at batch 4) further on the data-scaling curve's 500K replies (`make scaling-curve SIZES="14000 42000 126000 500000"
# PROMPTS=6400` writes them and their feature store: 511,671 reply tokens to self-chat turns), keeping its draft
# vocabulary, the held-out check every 351 steps keeping the best; training 33 min on the 2 cores.
SCALING_500K_REPLIES := $(DSPARK_CACHE)/scaling/replies-500000.jsonl
.PHONY: smollm2-regen-drafter
smollm2-regen-drafter: setup
	@test -s $(RETIRED)/smollm2-dspark-regen-seed9/model.safetensors || \
		{ echo "$(RETIRED)/smollm2-dspark-regen-seed9 is missing: make smollm2-regen-seed9-drafter"; exit 1; }
	@test -s $(SCALING_500K_REPLIES) || { echo "$(SCALING_500K_REPLIES) is missing: make scaling-curve \
		SIZES=\"14000 42000 126000 500000\" PROMPTS=6400 writes it"; exit 1; }
	$(DSPARK) train --target $(SMOLLM2) --data $(SCALING_500K_REPLIES) $(REGEN_FINE_TUNE) \
		--feature-cache $(DSPARK_CACHE)/train-features \
		--init-from-drafter $(RETIRED)/smollm2-dspark-regen-seed9 --steps 1404 --eval-every 351 \
		--out embedded/smollm2-dspark-regen --work-dir $(DSPARK_CACHE)/train-work/smollm2-dspark-regen

# Kubernetes (docs/deploy.md). The toolchain lives in $(DSPARK_CACHE)/k8s/bin: helm, kubectl and,
# for the tests, kube-apiserver/-controller-manager/-scheduler built from Debian's kubernetes source package.
.PHONY: k8s-tools image deploy undeploy
K8S_BIN := $(DSPARK_CACHE)/k8s/bin
k8s-tools:
	bash scripts/setup_k8s_tools.sh > /dev/null

# The serving image (docker/Dockerfile): SGLang 0.5.23's official image + the dspark wheel. Needs a Docker
# engine (CI has none, so CI never builds it); push it and set image.repository/tag in your values.
IMAGE ?= dspark:0.1.0-sglang0.5.23
image: setup
	rm -rf dist && $(PY) -m build --wheel --no-isolation --outdir dist . > /dev/null
	docker build -f docker/Dockerfile -t $(IMAGE) .

# helm upgrade --install into the current kube context: VALUES=file (e.g. helm/dspark/examples/qwen3-8b-gpu.yaml),
# NAMESPACE=, RELEASE=; --rollback-on-failure (helm 4's name for --atomic) undoes a failed install or upgrade.
# HELM_FLAGS adds helm flags (--set ..., --kube-context ...).
NAMESPACE ?= dspark
RELEASE ?= dspark
VALUES ?=
DEPLOY_TIMEOUT ?= 45m
HELM_FLAGS ?=
deploy:
	bash scripts/setup_k8s_tools.sh --clients > /dev/null
	$(K8S_BIN)/helm upgrade --install $(RELEASE) helm/dspark --namespace $(NAMESPACE) --create-namespace \
		$(if $(VALUES),--values $(VALUES)) --rollback-on-failure --wait --timeout $(DEPLOY_TIMEOUT) $(HELM_FLAGS)

undeploy:
	bash scripts/setup_k8s_tools.sh --clients > /dev/null
	$(K8S_BIN)/helm uninstall $(RELEASE) --namespace $(NAMESPACE) --wait
