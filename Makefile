# Every target installs what it needs into .venv by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install chat test lint bench clean

# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs torch's CPU build first (pypi.org's
# Linux x86-64 torch is the CUDA build, gigabytes of nvidia-* wheels).
TORCH_INDEX ?=

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/pip install --quiet torch==2.13.0 --index-url $(TORCH_INDEX))
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
