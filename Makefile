# Every target installs what it needs into .venv by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install chat test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[local,dev]'
	touch $(STAMP)

install: $(STAMP)

chat: $(STAMP)
	$(BIN)/arxivscout chat

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python bench/context_latency.py
	$(BIN)/python bench/ingest_throughput.py
	$(BIN)/python bench/harness_overhead.py
	$(BIN)/python bench/concurrent_threads.py
	$(BIN)/python bench/slack_load.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
