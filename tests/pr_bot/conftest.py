"""The gate's tests post through the fake GitHub (tests/web): make it importable from here."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for folder in (_TESTS / "web",):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
