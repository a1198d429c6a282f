# Two commands matter: `make run` (set up, seed demo data, serve dashboards) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
DATA_DIR ?= var

.PHONY: run test setup lint browser sandbox clean

# The CPU torch build must go in first: any other torch spec pulls a multi-GB CUDA build.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

# Debian's Chromium drives the page tests (a test tool's own browser download cannot work here).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# The agent runs pull-request code only inside bubblewrap (runners/sandbox.py); it refuses to
# start without it, and the security tests start it.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }

run: setup
	$(BIN)/cptrace serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR) --seed-demo

# The analysis library is typed strictly (pyproject [tool.mypy]); the rest is linted.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy analyzers

test: setup browser sandbox lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DATA_DIR) .pytest_cache .ruff_cache
