"""The two stages of a run analysed per rank, each one queue task in a limited child process.

A run of several trace files is analysed as one ``rank`` task per file and one ``merge`` task
(``service.storage.tasks``), which any workers on any hosts claim. A rank task's file is read
and attributed (``analyzers.rank_parts.analyze_rank``) and its part written to a file in the
task's scratch folder (``run_rank_stage``), which the worker stores in the blob store under its
content address; the merge task's worker fetches the parts and merges them into the report
(``run_merge_stage``). So the largest process holds one file's parse, not the run's. Each stage
runs in the one-process analysis' kind of child (``service.analysis_exec.analysis_child``, a
``service.limited_child.LimitedChild``): ``RLIMIT_AS`` of ``analysis_memory_limit_bytes``,
``analysis_time_limit_s`` per task, lower CPU priority, ending with the worker. The report is
the one-process analysis' byte for byte (``tests/analyzers/test_rank_parts.py``,
``tests/service/test_rank_tasks.py``) and is validated the same way before it is stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from analyzers.readers import TraceInput
from analyzers.report import AnalysisReport
from service.analysis_exec import (
    analysis_call,
    analysis_child,
    input_errors_are_final,
    validate_report,
)

T = TypeVar("T")


def _rank_stage(item: TraceInput, files: int, blob: str, max_decompressed_bytes: int) -> int:
    """In the child: one file read and attributed, its part written to ``blob``; returns the
    blob's size."""
    from analyzers.rank_parts import analyze_rank, dump_part

    def run() -> int:
        part = analyze_rank(item, files=files, max_decompressed_bytes=max_decompressed_bytes)
        return dump_part(part, Path(blob))

    return input_errors_are_final(run)


def _merge_stage(blobs: list[str], manifest_raw: Any) -> str:
    """In the child: the parts merged into the report (its JSON)."""
    from analyzers.catalog import load_catalog
    from analyzers.manifest import parse_manifest
    from analyzers.rank_parts import merge_part_blobs

    def merge() -> str:
        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        catalog = load_catalog()
        analysis = merge_part_blobs([Path(b) for b in blobs], manifest=manifest, catalog=catalog)
        return analysis.report.model_dump_json()

    return input_errors_are_final(merge)


def _in_child(
    fn: Callable[..., T],
    *args: Any,
    time_limit_s: float,
    memory_limit_bytes: int,
    progress: Callable[[str], None] | None = None,
) -> T:
    """``fn(*args)`` in a fresh limited child, killed afterwards however the call ended."""
    child = analysis_child(memory_limit_bytes, preload=(__name__,))
    try:
        return analysis_call(
            child, fn, *args, deadline=time.monotonic() + time_limit_s,
            time_limit_s=time_limit_s, progress=progress,
        )  # fmt: skip
    finally:
        child.kill()


def run_rank_stage(
    item: TraceInput,
    *,
    files: int,
    part: Path,
    time_limit_s: float,
    memory_limit_bytes: int,
    max_decompressed_bytes: int,
) -> int:
    """Read and attribute one of a run's ``files`` trace files into the part file ``part``;
    returns its size. :raises AnalysisFailed: with the reason (``final`` for bad input, memory,
    the time limit)."""
    return _in_child(
        _rank_stage, item, files, str(part), max_decompressed_bytes,
        time_limit_s=time_limit_s, memory_limit_bytes=memory_limit_bytes,
    )  # fmt: skip


def run_merge_stage(
    parts: Sequence[Path],
    manifest_raw: Any,
    *,
    time_limit_s: float,
    memory_limit_bytes: int,
) -> AnalysisReport:
    """Merge a run's part files (in its file order) into the report, validated.
    :raises AnalysisFailed: with the reason."""
    text = _in_child(
        _merge_stage, [str(p) for p in parts], manifest_raw,
        time_limit_s=time_limit_s, memory_limit_bytes=memory_limit_bytes,
    )  # fmt: skip
    return validate_report(text)
