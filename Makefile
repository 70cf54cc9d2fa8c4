# stock_locks: one-command setup, tests and demo (see scripts/).
# Extra arguments: make test ARGS="-k lock -x", make demo ARGS="--help".
SHELL := bash
.DEFAULT_GOAL := help
ARGS ?=
VENV_BIN := .venv/bin

.PHONY: help setup test demo lint format bench stop clean

help:
	@echo "Targets:"
	@echo "  make setup    create .venv, install deps, make sure redis-server and PostgreSQL are there"
	@echo "  make test     lint, then the test suite (pytest \$$ARGS) on the newest releases and on the"
	@echo "                lowest versions pyproject.toml allows; STOCK_LOCKS_TEST_RUNS=newest: only that run"
	@echo "  make demo     run the demo shop (manage.py demo \$$ARGS; DEMO_DATABASE=postgres for PostgreSQL)"
	@echo "  make lint     ruff check + ruff format --check + mypy + lint-imports (stock_locks)"
	@echo "  make format   ruff format + ruff check --fix"
	@echo "  make bench    run the benchmarks (python -m benchmarks \$$ARGS)"
	@echo "  make stop     stop our own PostgreSQL cluster and the demo redis-server"
	@echo "  make clean    stop them, then remove .cache and .venv"

setup:
	bash scripts/setup.sh

test:
	bash scripts/test.sh $(ARGS)

demo:
	bash scripts/demo.sh $(ARGS)

lint:
	bash scripts/setup.sh --no-services
	$(VENV_BIN)/ruff check . && $(VENV_BIN)/ruff format --check . && $(VENV_BIN)/mypy \
		&& $(VENV_BIN)/lint-imports

format:
	bash scripts/setup.sh --no-services
	$(VENV_BIN)/ruff format . && $(VENV_BIN)/ruff check --fix .

bench:
	bash scripts/setup.sh
	. .cache/env.sh && $(VENV_BIN)/python -m benchmarks $(ARGS)

stop:
	bash scripts/clean.sh --stop

clean:
	bash scripts/clean.sh
