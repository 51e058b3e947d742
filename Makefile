# dspark: every target sets up its own environment first (scripts/setup_env.sh is idempotent).
DSPARK_CACHE ?= $(HOME)/.cache/dspark
export DSPARK_CACHE
PY := $(DSPARK_CACHE)/venv/bin/python
DSPARK := $(DSPARK_CACHE)/venv/bin/dspark

.PHONY: setup test embedded-target drafters embedded-models

setup:
	bash scripts/setup_env.sh

test: setup
	$(PY) -m pytest

# Reproduce the committed embedded models (see the cards in embedded/*/README.md).
embedded-models: embedded-target drafters

# The committed target (embedded/target/README.md): 40 min on 2 cores.
embedded-target: setup
	$(DSPARK) embedded-target --out embedded/target --minutes 40 --seed 0 --lr 3e-3 --warmup-steps 50 \
		--threads 2 --eval-every 100
