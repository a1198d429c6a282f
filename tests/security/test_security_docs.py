"""Every pull-request loop setting (the webhook's limits among them) is documented with its
environment variable in docs/github.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.github_loop.config import LoopSettings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "github.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("field", sorted(LoopSettings.model_fields))
def test_every_loop_setting_is_documented(field: str) -> None:
    name = f"CPTRACE_GITHUB_{field.upper()}"
    short = "_" + field.upper().split("_", 1)[-1]
    assert name in DOC or (field.startswith("retry_") and short in DOC), name
