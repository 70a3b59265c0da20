# Two commands for a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Each creates .venv on first use: the CPU build of torch first (a plain `pip install torch`
# would pull a multi-GB CUDA build), then tspbench with its dev extra.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test check docs bench bench-compare gpu-check lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tspbench run experiments/quickstart.yaml --results results/demo
	$(BIN)/tspbench report results/demo/quickstart

# the whole suite, whole files spread over the CPUs (tests/conftest.py starts the longest first)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# the fast loop: lint and every test not marked slow (no multi-rank run, no sweep, no Slurm)
check: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -m "not slow"

# README.md and docs/*.md from docs/templates/, every number from results/
docs: $(STAMP)
	$(BIN)/python -m tools.gen_docs

BENCH := $(BIN)/python -m pytest benchmarks -q -p no:cacheprovider --benchmark-enable --benchmark-only \
	--benchmark-storage=file://benchmarks/saved --benchmark-columns=min,median,max,stddev,rounds

bench: $(STAMP)
	$(BENCH) --benchmark-autosave
	$(BIN)/tspbench check overlap

bench-compare: $(STAMP)
	$(BENCH) --benchmark-compare --benchmark-compare-fail=median:30%

gpu-check: $(STAMP)
	$(BIN)/tspbench gpu-check --out results/gpu_check

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
