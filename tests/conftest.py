"""Shared test fixtures. Test data lives in tests/data/<scenario>/ (real traces, gzipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA_DIR = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Root of the real test traces."""
    return DATA_DIR
