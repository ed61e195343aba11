# make install | demo | test | bench | lint | clean | airflow-db | dag-test | airflow
# Everything runs from the project's own virtualenv (.venv), created by `make install`;
# `. .venv/bin/activate` puts the same commands (leaderboard, airflow) on your PATH.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

ARGS ?=
PYTEST_ARGS ?=

# Spark in local mode: bind the driver to loopback (no hostname lookups, no LAN interface).
export SPARK_LOCAL_IP := 127.0.0.1

# Airflow on this machine: its metadata DB (sqlite) and logs under .airflow/ (git-ignored),
# the DAGs from dags/, no example DAGs. `make dag-test DATE=2026-12-02` runs one night.
AIRFLOW_ENV := AIRFLOW_HOME=$(CURDIR)/.airflow AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False
AIRFLOW_DB := .airflow/airflow.db
DATE ?= $(shell date -u +%F)

.PHONY: install demo test bench lint clean airflow-db dag-test airflow

install: $(STAMP)

# Reruns are a no-op until pyproject.toml changes.
$(STAMP): pyproject.toml scripts/ensure_redis.sh scripts/ensure_browser.sh \
		scripts/ensure_locale.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	scripts/ensure_redis.sh $(VENV)
	scripts/ensure_browser.sh
	scripts/ensure_locale.sh
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

# `airflow dags test` refuses to run on an unmigrated metadata DB ("Database migration
# required"): migrate the local one first (once; again after an Airflow upgrade).
airflow-db: $(AIRFLOW_DB)

$(AIRFLOW_DB): $(STAMP)
	mkdir -p .airflow
	$(AIRFLOW_ENV) $(BIN)/airflow db migrate > .airflow/migrate.log 2>&1 \
		|| { tail -n 20 .airflow/migrate.log; exit 1; }
	@echo "Airflow metadata DB ready: $(AIRFLOW_DB)"

# One night of the nightly DAG without a scheduler (as_of = DATE - 1), on ./data unless
# LEADERBOARD_DATA says otherwise.
dag-test: airflow-db
	$(AIRFLOW_ENV) $(BIN)/airflow dags test nightly_standings $(DATE)

# Scheduler, API server and UI on :8080 (sqlite), for a look at the DAG's runs.
airflow: airflow-db
	$(AIRFLOW_ENV) $(BIN)/airflow standalone

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
