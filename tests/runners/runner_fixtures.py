"""Helpers shared by the runner tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LiveService:
    url: str
    tokens: dict[str, str]
    app: Any


@dataclass
class FakeService:
    """A scriptable stand-in for failure modes the real service never produces on demand."""

    url: str = ""
    calls: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    handler: Callable[[str, dict[str, str], bytes], tuple[int, Any]] | None = None

    def paths(self) -> list[str]:
        return [c[0] for c in self.calls]
