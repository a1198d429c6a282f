"""Pure trace-analysis library: readers, attribution, metrics, findings, comparison.

No web, CLI or GPU dependency. Input: trace files (and an optional run manifest). Output: the
pydantic models of :mod:`analyzers.report`.

``analyze`` and ``compare_reports`` are the two entry points; both are imported lazily so that
importing one submodule (``analyzers.model`` in a reader) does not load the whole pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analyzers.compare import compare_reports
    from analyzers.pipeline import analyze

__all__ = ["analyze", "compare_reports"]


def __getattr__(name: str) -> Any:
    if name == "analyze":
        from analyzers.pipeline import analyze

        return analyze
    if name == "compare_reports":
        from analyzers.compare import compare_reports

        return compare_reports
    raise AttributeError(f"module 'analyzers' has no attribute {name!r}")
