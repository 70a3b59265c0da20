# Two commands for a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Each creates .venv on first use: the CPU build of torch first (a plain `pip install torch`
# would pull a multi-GB CUDA build), then tspbench with its dev extra.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test bench gpu-check lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tspbench run experiments/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m pytest benchmarks --benchmark-enable --benchmark-only --benchmark-autosave

gpu-check: $(STAMP)
	$(BIN)/python -m tspbench.gpu_check --out results/gpu_check

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
