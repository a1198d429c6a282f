"""Only strict JSON is stored: ``NaN`` and ``Infinity`` (which Python's ``json`` writes and
reads by default) are refused before they reach a table whose text the API serves verbatim."""

from __future__ import annotations

import json
from typing import Any

from service.core.errors import UnprocessableEntity


def strict_dumps(value: Any, *, what: str) -> str:
    """``json.dumps`` that refuses non-finite numbers; :raises UnprocessableEntity: naming
    ``what`` (``"manifest.json"``) when ``value`` holds NaN or Infinity."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise UnprocessableEntity(
            f"{what}: NaN and Infinity are not JSON numbers; use null or a finite number"
        ) from exc
