"""One analysis in its own process, under a time and a memory limit, its report checked.

The worker stays small and alive; the analysis (numpy, a whole trace in memory) runs in a
spawned child with ``RLIMIT_AS = analysis_memory_limit_bytes``. The child sends progress and
finally the report as JSON; the worker kills it at ``analysis_time_limit_s``. Whatever the
child produced is validated against ``AnalysisReport`` before it may be stored: a report that
cannot be read back is an analysis failure, not a stored run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from analyzers.readers import TraceInput
from analyzers.report import AnalysisReport
from service.core.config import MiB
from service.supervisor import describe_exit, follow_parent
from service.uploads_exec import limit_memory, lower_priority


class AnalysisFailed(Exception):
    """The analysis cannot succeed: ``final`` failures are not retried."""

    def __init__(self, message: str, *, final: bool) -> None:
        super().__init__(message)
        self.final = final


def _child(
    conn: Connection,
    parent_pid: int,
    memory_limit: int,
    paths: list[Path | TraceInput],
    manifest_raw: Any,
) -> None:
    follow_parent(parent_pid)
    lower_priority()
    # The libraries load first: the limit bounds what the analysis of this trace allocates,
    # not the fixed cost of mapping numpy and friends.
    from analyzers import analyze
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError, parse_manifest
    from analyzers.readers import read_kineto, read_nsys  # noqa: F401  (and sqlite3)

    limit_memory(memory_limit)
    try:

        def progress(*args: Any, **kwargs: Any) -> None:
            parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()]
            conn.send(("progress", " ".join(parts) or "analysing"))

        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        report = analyze(paths, manifest=manifest, progress=progress)
        conn.send(("ok", report.model_dump_json()))
    except MemoryError:
        conn.send(("memory", None))
    except (TraceError, ManifestError) as exc:
        conn.send(("input", str(exc)))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def run_isolated(
    paths: Sequence[Path | TraceInput],
    manifest_raw: Any,
    *,
    time_limit_s: float,
    memory_limit_bytes: int,
    progress: Callable[[str], None],
) -> AnalysisReport:
    """Analyse in a child process; :raises AnalysisFailed: with the reason."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_child,
        args=(child, os.getpid(), memory_limit_bytes, list(paths), manifest_raw),
        name="cptrace-analysis",
        daemon=True,
    )
    process.start()
    child.close()
    deadline = time.monotonic() + time_limit_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AnalysisFailed(
                    f"the analysis took longer than its time limit of {time_limit_s:g} s",
                    final=True,
                )
            if not parent.poll(min(remaining, 1.0)):
                continue
            try:
                kind, value = parent.recv()
            except EOFError:
                process.join(timeout=5)
                raise AnalysisFailed(
                    f"the analysis process ended without a result "
                    f"({describe_exit(process.exitcode)}; out of memory?)",
                    final=False,
                ) from None
            if kind == "progress":
                progress(value)
                continue
            if kind == "ok":
                return validate_report(value)
            if kind == "memory":
                raise AnalysisFailed(
                    f"the analysis needed more memory than its limit of "
                    f"{memory_limit_bytes // MiB} MiB",
                    final=True,
                )
            raise AnalysisFailed(value, final=kind == "input")
    finally:
        if process.is_alive():
            process.kill()
        process.join(timeout=5)
        with contextlib.suppress(Exception):
            parent.close()


def validate_report(text: str) -> AnalysisReport:
    """The report parsed back from its JSON; :raises AnalysisFailed: when it does not load."""
    try:
        return AnalysisReport.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise AnalysisFailed(
            f"the analysis produced a report that does not load ({exc.error_count()} "
            f"error(s); first at {where or 'the top'}: {first.get('msg')}); "
            "the trace holds values the report cannot represent",
            final=True,
        ) from None
