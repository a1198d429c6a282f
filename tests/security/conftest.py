"""Security tests reuse the fake GitHub (tests/web), the real-server helper (tests/service) and
the loop's git repository (tests/prloop): make them importable from here."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for folder in (_TESTS / "web", _TESTS / "service", _TESTS / "prloop"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
