"""Shared test fixtures. Test data lives in tests/data/<scenario>/ (real traces, gzipped).

Helpers every room uses are in ``tests/testkit`` (the data path, free ports, shared traces).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from testkit import DATA_DIR, SHARED_TRACES_ENV


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


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Root of the real test traces."""
    return DATA_DIR


_SHARED_SCOPES = ("module", "class", "package")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (``--dist loadgroup``) the tests of a module that share a fixture wider
    than a test (a server, a database, a built bundle) run on one worker, in file order, so it
    is built once; every other test is spread over the workers one by one. (Marked as each item
    is collected: xdist reads the groups in its own ``pytest_collection_modifyitems``.)"""
    if any(m.name == "xdist_group" for m in item.iter_markers()):
        return
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return
    scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs if d.baseid != ""}
    if scopes & set(_SHARED_SCOPES):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
