# Two commands matter: `make run` (set up, seed demo data, serve dashboards) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
DATA_DIR ?= var
# pytest-xdist workers. --dist loadfile: the tests of one file run on one worker, in order, so a
# module's shared server or database is built once (xdist 3.8's loadgroup cannot group under
# pytest 9: it renames a node id attribute pytest 9 no longer reads). --no-loadscope-reorder:
# files are handed out in collection order, where tests/conftest.py puts the slow files first.
TEST_WORKERS ?= auto
PYTEST_ARGS ?=

.PHONY: run test setup setup-run lint browser sandbox postgres clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Runtime only: the packages and the fast nsys reader, no test tools, no torch.
$(BIN)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[fast]'
	touch $@

# Development: the CPU torch build must go in first (any other torch spec pulls a multi-GB
# CUDA build), then the test and lint tools.
$(BIN)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,s3]'
	touch $@

setup: $(BIN)/.installed

setup-run: $(BIN)/.installed-run

# Debian's Chromium drives the page tests (a test tool's own browser download cannot work here).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# The agent runs pull-request code only inside bubblewrap (runners/sandbox.py); it refuses to
# start without it, and the security tests start it.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }

# The storage, worker and job-queue tests also run on a real PostgreSQL server, which the tests
# start themselves in a temp folder (tests/service/postgres_server.py) from Debian's binaries.
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }

run: setup-run
	$(BIN)/cptrace serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR) --seed-demo

# Every package is type-checked: analyzers strictly (pyproject [tool.mypy]: a per-module override,
# so one invocation checks each package as configured), the rest as configured. One run loads the
# incremental cache (.mypy_cache, kept between runs) once: a warm check takes seconds.
MYPY_PACKAGES := analyzers service web pr_bot contracts runners cptrace cp_attention

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy $(MYPY_PACKAGES)

test: setup browser sandbox postgres lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(DATA_DIR) .pytest_cache .ruff_cache .mypy_cache
