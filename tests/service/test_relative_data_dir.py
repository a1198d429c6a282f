"""`make run` passes a relative --data-dir; analysis must still find the stored traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.config import Settings


def test_relative_data_dir_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(data_dir=Path("var"))
    assert settings.data_dir == tmp_path / "var"
    assert settings.blob_dir.is_absolute() and settings.tmp_dir.is_absolute()
