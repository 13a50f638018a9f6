# Two commands: `make demo` sets up and runs the embedded default; `make test` sets up and runs the tests.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_DIR ?= runs/demo

.PHONY: demo test test-slow test-all bench install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# CPU torch where there is no GPU: the pinned CPU build, before anything can pull a CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/python -m pip install --quiet torch==2.13.0; fi
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pcl train configs/tiny.yaml --run-dir $(RUN_DIR)

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q  # gpu tests run where a GPU is, else skip with the reason

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow" -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
