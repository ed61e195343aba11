# make install | demo | test | bench | lint | clean
# Everything runs from the project's own virtualenv (.venv), created by `make install`.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

ARGS ?=
PYTEST_ARGS ?=

# Spark in local mode: bind the driver to loopback (no hostname lookups, no LAN interface).
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: install demo test bench lint clean

install: $(STAMP)

# Reruns are a no-op until pyproject.toml changes.
$(STAMP): pyproject.toml scripts/ensure_redis.sh scripts/ensure_browser.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	scripts/ensure_redis.sh $(VENV)
	scripts/ensure_browser.sh
	touch $@

demo: install
	$(BIN)/leaderboard demo $(ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	@set -e; for script in bench/bench_*.py; do \
		[ -e "$$script" ] || { echo "no benchmarks in bench/"; break; }; \
		echo "== $$script"; \
		$(BIN)/python "$$script"; \
	done

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Generated data only: data/README.md stays. The local Redis daemon (data/redis/) is
# stopped first, so that it does not go on writing into removed files.
clean:
	if [ -x $(BIN)/python ] && [ -e data/redis/server.json ]; then \
		$(BIN)/python -c 'from pathlib import Path; \
			from leaderboard.redis_server import stop_local_server; \
			stop_local_server(Path("data"))'; \
	fi
	find data -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
