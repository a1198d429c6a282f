"""One analysis in its own process, under a time and a memory limit, its report checked.

The worker stays small and alive; the analysis (numpy, a whole trace in memory) runs in a
spawned ``service.limited_child.LimitedChild`` with ``RLIMIT_AS = analysis_memory_limit_bytes``.
The child sends progress and finally the report as JSON; the worker kills it at
``analysis_time_limit_s``. Whatever the child produced is validated against ``AnalysisReport``
before it may be stored: a report that cannot be read back is an analysis failure, not a stored
run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from analyzers.readers import TraceInput
from analyzers.report import AnalysisReport
from contracts.validation import first_error
from service.core.config import MiB
from service.limited_child import (
    CallOutOfMemory,
    CallTimedOut,
    ChildDied,
    ChildError,
    LimitedChild,
)

T = TypeVar("T")

PRELOAD = (
    __name__,
    "analyzers",
    "analyzers.manifest",
    "analyzers.rank_parts",
    "analyzers.readers.kineto",  # the readers load on first use: load both now
    "analyzers.readers.nsys",
    "sqlite3",
)
"""Loaded in the child before its limit: the limit bounds what the analysis allocates, not the
fixed cost of mapping numpy, orjson and friends."""


class AnalysisFailed(Exception):
    """The analysis cannot succeed: ``final`` failures are not retried."""

    def __init__(self, message: str, *, final: bool) -> None:
        super().__init__(message)
        self.final = final


class BadInput(Exception):
    """In the child: the traces or the manifest are wrong (final: retrying cannot help)."""


def input_errors_are_final(run: Callable[[], T]) -> T:
    """``run()`` in the child, its ``TraceError``/``ManifestError`` raised as :class:`BadInput`."""
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError

    try:
        return run()
    except (TraceError, ManifestError) as exc:
        raise BadInput(str(exc)) from None


def analysis_child(memory_limit_bytes: int, *, preload: tuple[str, ...] = ()) -> LimitedChild:
    """A limited child for analysis work: :data:`PRELOAD` and ``preload`` (the caller's module,
    whose functions it will call) loaded before the limit."""
    return LimitedChild(
        memory_limit_bytes=memory_limit_bytes,
        name="cptrace-analysis",
        preload=(*PRELOAD, *preload),
    )


def analysis_call(
    child: LimitedChild,
    fn: Callable[..., T],
    *args: Any,
    deadline: float,
    time_limit_s: float,
    progress: Callable[[str], None] | None = None,
) -> T:
    """``child.call`` by ``deadline`` (of the whole analysis, ``time_limit_s`` long), each way
    it can end as :class:`AnalysisFailed`. :raises AnalysisFailed: with the reason."""
    timed_out = AnalysisFailed(
        f"the analysis took longer than its time limit of {time_limit_s:g} s", final=True
    )
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise timed_out
    try:
        value: T = child.call(fn, *args, time_limit_s=remaining, progress=progress)
    except CallTimedOut:
        raise timed_out from None
    except CallOutOfMemory:
        raise AnalysisFailed(
            f"the analysis needed more memory than its limit of "
            f"{child.memory_limit_bytes // MiB} MiB",
            final=True,
        ) from None
    except ChildDied as exc:
        raise AnalysisFailed(
            f"the analysis process ended without a result ({exc}; out of memory?)", final=False
        ) from None
    except BadInput as exc:
        raise AnalysisFailed(str(exc), final=True) from None
    except ChildError as exc:
        raise AnalysisFailed(str(exc), final=False) from None
    except Exception as exc:
        raise AnalysisFailed(f"{type(exc).__name__}: {exc}", final=False) from None
    return value


def _analyse(
    paths: list[Path | TraceInput],
    manifest_raw: Any,
    max_decompressed_bytes: int,
    progress: Callable[[str], None],
) -> str:
    """The child's call: the report as JSON (validated again by the parent)."""
    from analyzers import analyze
    from analyzers.manifest import parse_manifest

    def report_progress(*args: Any, **kwargs: Any) -> None:
        parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()]
        progress(" ".join(parts) or "analysing")

    def run() -> str:
        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        return analyze(
            paths,
            manifest=manifest,
            progress=report_progress,
            max_decompressed_bytes=max_decompressed_bytes,
        ).model_dump_json()

    return input_errors_are_final(run)


def run_isolated(
    paths: Sequence[Path | TraceInput],
    manifest_raw: Any,
    *,
    time_limit_s: float,
    memory_limit_bytes: int,
    max_decompressed_bytes: int,
    progress: Callable[[str], None],
) -> AnalysisReport:
    """Analyse in a child process; :raises AnalysisFailed: with the reason."""
    deadline = time.monotonic() + time_limit_s
    child = analysis_child(memory_limit_bytes)
    try:
        text = analysis_call(
            child, _analyse, list(paths), manifest_raw, max_decompressed_bytes,
            deadline=deadline, time_limit_s=time_limit_s, progress=progress,
        )  # fmt: skip
    finally:
        child.kill()
    return validate_report(text)


def validate_report(text: str) -> AnalysisReport:
    """The report parsed back from its JSON; :raises AnalysisFailed: when it does not load."""
    try:
        return AnalysisReport.model_validate_json(text)
    except ValidationError as exc:
        first = first_error(exc)
        raise AnalysisFailed(
            f"the analysis produced a report that does not load ({exc.error_count()} "
            f"error(s); first at {first.where('the top')}: {first.message}); "
            "the trace holds values the report cannot represent",
            final=True,
        ) from None
