"""Host time per helper, from the annotation ranges alone: what a trace without GPU work shows.

Why: a CPU run (gloo, ``runners/examples/cpu_smoke.yaml``) or a CPU-only profile has no kernels,
so every GPU table is empty; but its ranges still say which catalogued helper ran, how often and
for how long on the host. Those figures, and the findings they alone support, are reported here.

Definitions (per rank and window group; whole-trace numbers are totals over the trace):

* **calls**: outermost ranges of the helper: a catalogued range whose nearest enclosing
  catalogued range (same thread) is not of the same helper. Recursion and
  a helper's NVTX + ``record_function`` twin ranges count once.
* **inclusive ns**: summed duration of those calls.
* **self ns**: inclusive time minus the time of catalogued ranges of *other* helpers nested
  directly inside the calls (a helper inside a helper is charged to the inner one).
* **per step**: totals divided by the number of step windows of the group, and labelled so;
  the whole-trace row is never "per step".

A call belongs to the window holding its start, like the launches of the GPU tables. The
report model (``HostTimeReport``, ``HelperHostTime``) lives with the others in ``report``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from analyzers.attribution import RangeHelpers, RangeIndex
from analyzers.catalog import Catalog
from analyzers.metrics import assign_windows
from analyzers.model import Trace
from analyzers.report import (
    HOST_TIME_BASIS,
    Evidence,
    Finding,
    HelperHostTime,
    HostTimeReport,
    Severity,
    Window,
)
from analyzers.windows import WHOLE_TRACE, group_names

IntArray = npt.NDArray[np.int64]


def host_time(
    trace: Trace,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    steps: Mapping[tuple[int, str], int] | None = None,
) -> HostTimeReport:
    """Calls, inclusive and self host time of every catalogued helper per rank and group.

    ``steps`` ((rank, group) -> steps, as the GPU metrics count them) defaults to the number of
    windows of each group."""
    out = HostTimeReport(basis=HOST_TIME_BASIS, gpu_activity=bool(len(trace.activities)))
    rows = np.flatnonzero(ranges.helper >= 0).astype(np.int64)
    if not len(rows) or not windows:
        return out
    table = trace.ranges
    helper = ranges.helper[rows].astype(np.int64)
    start = table["start"][rows].astype(np.int64)
    end = np.maximum(table["end"][rows].astype(np.int64), start)
    parent = _parents(table["thread"][rows].astype(np.int64), start, end)
    parent_helper = np.where(parent >= 0, helper[np.maximum(parent, 0)], -1)
    top = _outermost(parent, helper)
    is_call = parent_helper != helper
    duration = end - start
    # Time of another helper's range charged away from the call that directly encloses it.
    nested_other = np.flatnonzero((parent >= 0) & (parent_helper != helper))
    charged = np.zeros(len(rows), dtype=np.int64)
    np.add.at(charged, top[parent[nested_other]], duration[nested_other])
    rank = table["rank"][rows].astype(np.int64)
    if steps is None:
        counted: dict[tuple[int, str], int] = {}
        for w in windows:
            key = (w.rank, w.group or w.name)
            counted[key] = counted.get(key, 0) + 1
        steps = counted
    calls = np.flatnonzero(is_call)
    for group in group_names(windows):
        mine = [w for w in windows if (w.group or w.name) == group]
        where = assign_windows(rank[calls], start[calls], mine)
        inside = calls[where >= 0]
        pairs = zip(rank[inside].tolist(), helper[inside].tolist(), strict=True)
        for r, h in sorted(set(pairs)):
            sel = inside[(rank[inside] == r) & (helper[inside] == h)]
            inclusive = int(duration[sel].sum())
            out.helpers.append(
                HelperHostTime(
                    rank=r,
                    window=group,
                    steps=steps.get((r, group), 1),
                    helper=catalog.helpers[h].name,
                    category=catalog.helpers[h].category,
                    calls=len(sel),
                    inclusive_ns=inclusive,
                    self_ns=max(inclusive - int(charged[sel].sum()), 0),
                )
            )
    return out


def _parents(thread: IntArray, start: IntArray, end: IntArray) -> IntArray:
    """Position of the nearest enclosing range among the given ones (same thread), -1 if none:
    the nesting attribution's ``RangeIndex`` computes, mapped back to the input order."""
    index = RangeIndex(thread, start, end, np.arange(len(start), dtype=np.int64))
    out = np.full(len(start), -1, dtype=np.int64)
    out[index.rows] = np.where(index.parent >= 0, index.rows[np.maximum(index.parent, 0)], -1)
    return out


def _outermost(parent: IntArray, helper: IntArray) -> IntArray:
    """For each range, the outermost enclosing range of the same helper reached through
    ranges of that helper only (itself when its parent is another helper's or none)."""
    top = np.arange(len(parent), dtype=np.int64)
    while True:
        up = parent[top]
        climb = (up >= 0) & (helper[np.maximum(up, 0)] == helper[top])
        if not climb.any():
            return top
        top = np.where(climb, up, top)


def host_time_findings(report: HostTimeReport, catalog: Catalog) -> list[Finding]:
    """What host time alone supports, for traces without GPU activity.

    A helper that feeds a rule (``finding`` in the catalog) and was *called* in a step window
    shows that the code path ran: TE's padded THD path (``get_cu_seqlens_on_cp_rank``), the
    THD gradient zero-fill, a host-blocking batch slicer. Its GPU cost needs a GPU trace, so
    these are stated as observations (severity info) with the calls and host time per step;
    with GPU activity the GPU-based rules decide instead and nothing is added here.
    """
    if report.gpu_activity:
        return []
    feeds = {h.name: h.finding for h in catalog.helpers if h.finding}
    rows = [r for r in report.helpers if r.window != WHOLE_TRACE and r.helper in feeds]
    out = []
    for group, helper in sorted({(r.window, r.helper) for r in rows}):
        mine = sorted((r for r in rows if r.window == group and r.helper == helper), key=_rank)
        evidence = [
            item
            for r in mine
            for item in (
                Evidence(
                    name="calls per step (host ranges)",
                    value=round(r.calls / max(r.steps, 1), 2),
                    rank=r.rank,
                    window=group,
                ),
                Evidence(
                    name="host time per step, inclusive",
                    value=round(r.inclusive_ns / max(r.steps, 1) / 1e6, 4),
                    unit="ms",
                    rank=r.rank,
                    window=group,
                ),
            )
        ]
        out.append(
            Finding(
                rule=str(feeds[helper]),
                title=(
                    f"{helper} ran in {group!r} ({mine[0].calls} calls on rank {mine[0].rank}); "
                    "the trace has no GPU activity, so only its host time is known"
                ),
                severity=Severity.INFO,
                helper=helper,
                window=group,
                ranks=sorted({r.rank for r in mine}),
                evidence=evidence,
                recommendation=(
                    f"{helper} feeds the {feeds[helper]} rule: profile a GPU run of the same "
                    "workload to measure its kernels and the saving (see docs/analyzers.md)."
                ),
            )
        )
    return out


def _rank(row: HelperHostTime) -> int:
    return row.rank


__all__ = ["host_time", "host_time_findings"]
