"""A run of several trace files analysed per rank: parts in parallel, then one merge.

Each trace file (one rank's Kineto trace; an nsys export) is read and attributed
(``analyzers.rank_parts.analyze_rank``) in one of up to ``analysis_rank_workers`` limited
children, which writes the part to a blob in the task's scratch folder; a last call merges the
parts into the report (``merge_parts``). So the largest process holds one file's parse, not the
run's, and a run's ranks use ``analysis_rank_workers`` cores. The children are the one-process
analysis' (``service.analysis_exec.analysis_child``, a ``service.limited_child.LimitedChild``):
``RLIMIT_AS`` of ``analysis_memory_limit_bytes``, the whole run within
``analysis_time_limit_s``, lower CPU priority, and they end with the worker. The report is the
one-process analysis' byte for byte (``tests/analyzers/test_rank_parts.py``) and is validated
the same way before it is stored.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from service.limited_child import LimitedChild

T = TypeVar("T")


def _rank_stage(item: TraceInput, files: int, blob: str, max_decompressed_bytes: int) -> int:
    """One file read and attributed, its part written to ``blob``; returns the blob's size."""
    from analyzers.rank_parts import analyze_rank, dump_part

    def run() -> int:
        part = analyze_rank(item, files=files, max_decompressed_bytes=max_decompressed_bytes)
        return dump_part(part, Path(blob))

    return input_errors_are_final(run)


def _merge_stage(blobs: list[str], manifest_raw: Any) -> str:
    """The parts merged into the report (its JSON)."""
    from analyzers.catalog import load_catalog
    from analyzers.manifest import parse_manifest
    from analyzers.rank_parts import merge_part_blobs

    def merge() -> str:
        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        catalog = load_catalog()
        analysis = merge_part_blobs([Path(b) for b in blobs], manifest=manifest, catalog=catalog)
        return analysis.report.model_dump_json()

    return input_errors_are_final(merge)


def run_per_rank(
    inputs: Sequence[TraceInput],
    manifest_raw: Any,
    *,
    scratch: Path,
    workers: int,
    time_limit_s: float,
    memory_limit_bytes: int,
    max_decompressed_bytes: int,
    progress: Callable[[str], None],
) -> AnalysisReport:
    """Analyse ``inputs`` per rank in up to ``workers`` limited children, then merge.

    :raises AnalysisFailed: with the reason (``final`` for bad input, memory, the time limit).
    """
    deadline = time.monotonic() + time_limit_s
    count = len(inputs)
    size = max(1, min(workers, count))
    children = [analysis_child(memory_limit_bytes, preload=(__name__,)) for _ in range(size)]
    idle: queue.Queue[LimitedChild] = queue.Queue()
    for child in children:
        idle.put(child)

    def stage(fn: Callable[..., T], *args: Any) -> T:
        child = idle.get()
        try:
            return analysis_call(child, fn, *args, deadline=deadline, time_limit_s=time_limit_s)
        finally:
            idle.put(child)

    threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="cptrace-rank")
    try:
        blobs = [str(scratch / f"part{i:04d}.npz") for i in range(count)]
        pending = [
            threads.submit(stage, _rank_stage, item, count, blob, max_decompressed_bytes)
            for item, blob in zip(inputs, blobs, strict=True)
        ]
        for done, future in enumerate(pending, start=1):
            future.result()  # the first failure ends the run (the rest are stopped below)
            progress(f"ranks: {done} of {count} files read and attributed")
        progress(f"merging {count} files")
        text = stage(_merge_stage, blobs, manifest_raw)
    finally:
        for child in children:  # on success or failure: a call still running ends at once
            child.kill()
        threads.shutdown(wait=True, cancel_futures=True)
    return validate_report(text)
