# Setup, demo and tests. `make demo` and `make test` are the two commands in README.md.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0: the CPU build on machines that have it locally, the CUDA build from PyPI elsewhere.
TORCH ?= torch==2.13.0

.PHONY: setup demo test bench clean

$(BIN)/ragbatch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/ragbatch

demo: setup
	$(BIN)/ragbatch run jobs/tonic_paul_graham.yaml
	$(BIN)/ragbatch run jobs/ares.yaml

test: setup
	$(BIN)/python -m pytest

clean:
	rm -rf out .pytest_cache .hypothesis
