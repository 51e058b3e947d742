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
