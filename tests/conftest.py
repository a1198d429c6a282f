"""Shared test fixtures. Test data lives in tests/data/<scenario>/ (real traces, gzipped).

Helpers every room uses are in ``tests/testkit`` (the data path, free ports, shared traces).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from testkit import DATA_DIR, SHARED_TRACES_ENV, slow_files_first

pytest_plugins = ["testkit.cpu_time"]  # --cpu-durations=N: the suite's own cost, not the machine's

# One intra-op thread per test process, set before any test module imports torch and inherited
# by every child a test starts. `make test` runs two xdist workers on two cores: torch's default
# (one OpenMP thread per core in each worker) oversubscribes the cores, and the threads' barriers
# on the tiny tensors of the tests cost 10-30x the work itself when the machine is loaded (one
# cp=4 ring step of tests/cp_attention: 0.12 s with one thread, 1.0-3.4 s with two at a load of
# 8-10). torchrun already gives its ranks one thread each; a test that needs the variable unset
# removes it itself (tests/runners/test_profile_cpu.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shared-traces",
        default=None,
        help=f"folder of extra real traces outside the repository (or ${SHARED_TRACES_ENV}); "
        "tests over them skip without it",
    )


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption("--shared-traces")
    if value:  # before collection: modules that parametrize over the traces read it at import
        os.environ[SHARED_TRACES_ENV] = str(Path(value).resolve())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow files first, each whole (``testkit.slow_files_first``)."""
    slow_files_first(items)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Root of the real test traces."""
    return DATA_DIR

