"""Error text that leaves the server names the user's files, never the server's paths.

Readers and validators name the file they were given, and the service gives them temp files,
blob links and scratch folders under ``data_dir``. ``redact`` puts the uploaded names back
(``labels``: server path -> the name the user uploaded) and replaces any other path under the
data directory with a neutral word. The full, unredacted text goes to the server log.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path

_PID = re.compile(r"\b(pid|process)[ =:]+\d+\b", re.IGNORECASE)


def redact(text: str, data_dir: Path, labels: Mapping[str, str] | None = None) -> str:
    """``text`` without server paths or process ids."""
    for path, label in sorted((labels or {}).items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, label)
    roots = {str(data_dir)}
    with contextlib.suppress(OSError):
        roots.add(str(Path(data_dir).resolve()))
    for root in sorted(roots, key=len, reverse=True):
        # a path under the data directory, up to whitespace, a quote or a colon
        text = re.sub(re.escape(root) + r"[^\s'\":,)]*", "the uploaded file", text)
    return _PID.sub(r"\1", text)
