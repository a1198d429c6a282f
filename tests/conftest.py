"""Shared test fixtures. Test data lives in tests/data/<scenario>/ (real traces, gzipped).

Helpers every room uses are in ``tests/testkit`` (the data path, free ports, shared traces).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from testkit import DATA_DIR, SHARED_TRACES_ENV, slow_files_first


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

