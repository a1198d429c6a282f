"""A run of several trace files analysed per rank: R per-rank processes in parallel, one merge.

Each trace file (one rank's Kineto trace; an nsys export) is read and attributed in a process
of its own (``analyzers.rank_parts.analyze_rank``) that writes the part to a blob in the
task's scratch folder; a last process merges the parts into the report
(``merge_parts``). So the largest process holds one file's parse, not the run's, and a run's
ranks use ``analysis_rank_workers`` cores. Every process runs under the same limits as the
one-process analysis (``service.analysis_exec``): ``RLIMIT_AS`` of
``analysis_memory_limit_bytes``, the whole run within ``analysis_time_limit_s``, lower CPU
priority, and it ends with the worker. The report is the one-process analysis' byte for byte
(``tests/analyzers/test_rank_parts.py``) and is validated the same way before it is stored.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

from analyzers.readers import TraceInput
from analyzers.report import AnalysisReport
from service.analysis_exec import AnalysisFailed, validate_report
from service.core.config import MiB
from service.supervisor import follow_parent
from service.uploads_exec import limit_memory, lower_priority

Outcome = tuple[str, Any]
"""What a stage process returns: ``("ok", value)``, ``("input", message)`` (bad traces or
manifest: final), ``("memory", None)`` or ``("error", message)``."""


def _start(parent_pid: int, memory_limit: int) -> None:
    """Each pool process: follow the worker, yield the CPU, load the libraries, then limit."""
    follow_parent(parent_pid)
    lower_priority()
    import analyzers.rank_parts  # noqa: F401  (numpy, the pipeline; before the limit)
    from analyzers.readers import read_kineto, read_nsys  # noqa: F401

    limit_memory(memory_limit)


def _guarded(stage: Callable[[], Any]) -> Outcome:
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError

    try:
        return "ok", stage()
    except MemoryError:
        return "memory", None
    except (TraceError, ManifestError) as exc:
        return "input", str(exc)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def _rank_stage(item: TraceInput, files: int, blob: str) -> Outcome:
    """One file read and attributed, its part written to ``blob``; returns the blob's size."""
    from analyzers.rank_parts import analyze_rank, dump_part

    return _guarded(lambda: dump_part(analyze_rank(item, files=files), Path(blob)))


def _merge_stage(blobs: list[str], manifest_raw: Any) -> Outcome:
    """The parts merged into the report (its JSON)."""
    from analyzers.catalog import load_catalog
    from analyzers.manifest import parse_manifest
    from analyzers.rank_parts import load_part, merge_parts

    def merge() -> str:
        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        catalog = load_catalog()
        parts = (load_part(Path(b), catalog) for b in blobs)  # the merge owns (frees) them
        return merge_parts(parts, manifest=manifest, catalog=catalog).report.model_dump_json()

    return _guarded(merge)


def run_per_rank(
    inputs: Sequence[TraceInput],
    manifest_raw: Any,
    *,
    scratch: Path,
    workers: int,
    time_limit_s: float,
    memory_limit_bytes: int,
    progress: Callable[[str], None],
) -> AnalysisReport:
    """Analyse ``inputs`` per rank in up to ``workers`` processes, then merge.

    :raises AnalysisFailed: with the reason (``final`` for bad input, memory, the time limit).
    """
    deadline = time.monotonic() + time_limit_s
    ctx = multiprocessing.get_context("spawn")
    count = len(inputs)
    with ctx.Pool(
        processes=max(1, min(workers, count)),
        initializer=_start,
        initargs=(os.getpid(), memory_limit_bytes),
    ) as pool:  # leaving the block terminates the processes, on success or failure
        blobs = [str(scratch / f"part{i:04d}.npz") for i in range(count)]
        pending = [
            pool.apply_async(_rank_stage, (item, count, blob))
            for item, blob in zip(inputs, blobs, strict=True)
        ]
        for done, result in enumerate(pending, start=1):
            _value(result, deadline, time_limit_s, memory_limit_bytes)
            progress(f"ranks: {done} of {count} files read and attributed")
        progress(f"merging {count} files")
        merged = pool.apply_async(_merge_stage, (blobs, manifest_raw))
        text = _value(merged, deadline, time_limit_s, memory_limit_bytes)
    return validate_report(text)


def _value(
    result: AsyncResult[Outcome], deadline: float, time_limit_s: float, memory_limit: int
) -> Any:
    try:
        kind, value = result.get(timeout=max(0.0, deadline - time.monotonic()))
    except multiprocessing.TimeoutError:
        raise AnalysisFailed(
            f"the analysis took longer than its time limit of {time_limit_s:g} s", final=True
        ) from None
    if kind == "ok":
        return value
    if kind == "memory":
        raise AnalysisFailed(
            f"the analysis needed more memory than its limit of {memory_limit // MiB} MiB",
            final=True,
        )
    raise AnalysisFailed(str(value), final=kind == "input")
