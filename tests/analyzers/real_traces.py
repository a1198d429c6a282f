"""The real Kineto traces read and analysed once per test process.

Several test files check different figures of the same whole-trace report (counts, times and
bytes in ``test_reference_figures``, step windows in ``test_step_window_real``): each reading a
reference rank and analysing it again cost seconds of CPU per file. Imported by package path
(``tests.analyzers.real_traces``) so every file sees one cache. The callers only read the
trace and the report.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

from analyzers.model import Trace
from analyzers.pipeline import analyze_trace
from analyzers.readers.kineto import read_kineto
from analyzers.report import AnalysisReport


@cache
def kineto_rank(path: Path) -> int:
    """distributedInfo.rank, else 0: a single-process profile (the figures do not depend on it)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        info = json.load(f).get("distributedInfo") or {}
    return int(info.get("rank", 0))


@cache
def ranked_kineto(path: Path) -> Trace:
    """The trace as ``read_kineto`` reads it at the file's own rank."""
    return read_kineto(path, rank=kineto_rank(path))


@cache
def whole_trace_report(path: Path) -> AnalysisReport:
    """``analyze_trace`` of ``ranked_kineto(path)`` with the default step rule."""
    return analyze_trace(ranked_kineto(path)).report
