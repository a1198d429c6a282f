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
* **first call ns**: duration of the rank's first call of the helper in the whole trace, when
  it is one of the group's calls: a compiled helper compiles on it, any helper warms up on it,
  so it is reported apart from the steady state (``inclusive - first call``).
* **sync ops**: catalogued host-sync operators (``[host_sync] ops``: ``aten::item``,
  ``aten::nonzero``, ...) that start inside the calls on the same thread. On a CPU trace they
  block nothing; on a GPU tensor each one waits for the device.
* **per step**: totals divided by the number of step windows of the group, and labelled so;
  the whole-trace row is never "per step".

A call belongs to the window holding its start, like the launches of the GPU tables. The
findings these figures support on a trace without GPU activity are the rules' own
(``analyzers.findings``, which read this report). The report model (``HostTimeReport``,
``HelperHostTime``) lives with the others in ``report``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from analyzers.attribution import RangeHelpers, RangeIndex
from analyzers.catalog import Catalog
from analyzers.metrics import PointsByRank, assign_windows
from analyzers.model import RangeKind, Trace
from analyzers.report import HOST_TIME_BASIS, HelperHostTime, HostTimeReport, Window
from analyzers.windows import group_names

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
    thread = table["thread"][rows].astype(np.int64)
    first = _first_calls(rank, helper, start, is_call)
    syncs = _sync_ops_inside(trace, catalog, thread, start, end)
    if steps is None:
        counted: dict[tuple[int, str], int] = {}
        for w in windows:
            key = (w.rank, w.group or w.name)
            counted[key] = counted.get(key, 0) + 1
        steps = counted
    calls = np.flatnonzero(is_call)
    n_helpers = len(catalog.helpers)
    call_points = PointsByRank(rank[calls], start[calls])  # split by rank once for all groups
    for group in group_names(windows):
        mine = [w for w in windows if (w.group or w.name) == group]
        where = assign_windows(rank[calls], start[calls], mine, split=call_points)
        inside = calls[where >= 0]
        if not len(inside):
            continue
        # one int64 code per (rank, helper), in (rank, helper) order; sums per code by one
        # stable sort and segment sums (exact integers), not a mask per pair
        code = (rank[inside] + 1) * n_helpers + helper[inside]
        order = inside[np.argsort(code, kind="stable")]
        code = (rank[order] + 1) * n_helpers + helper[order]
        heads = np.flatnonzero(np.concatenate(([True], code[1:] != code[:-1])))
        counts = np.diff(np.append(heads, len(order)))

        def sums(values: IntArray, order: IntArray = order, heads: IntArray = heads) -> list[int]:
            return [int(v) for v in np.add.reduceat(values[order], heads)]

        inclusive = sums(duration)
        nested = sums(charged)
        first_ns = sums(np.where(first, duration, 0))
        sync_ops = sums(syncs)
        for j, (r, h) in enumerate(zip(rank[order[heads]].tolist(), helper[order[heads]].tolist(),
                                       strict=True)):  # fmt: skip
            out.helpers.append(
                HelperHostTime(
                    rank=r,
                    window=group,
                    steps=steps.get((r, group), 1),
                    helper=catalog.helpers[h].name,
                    category=catalog.helpers[h].category,
                    calls=int(counts[j]),
                    inclusive_ns=inclusive[j],
                    self_ns=max(inclusive[j] - nested[j], 0),
                    first_call_ns=first_ns[j],
                    sync_ops=sync_ops[j],
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


def _first_calls(
    rank: IntArray, helper: IntArray, start: IntArray, is_call: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Marks each (rank, helper)'s earliest call in the whole trace."""
    out = np.zeros(len(rank), dtype=bool)
    calls = np.flatnonzero(is_call)
    if not len(calls):
        return out
    order = calls[np.lexsort((start[calls], helper[calls], rank[calls]))]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (rank[order][1:] != rank[order][:-1]) | (helper[order][1:] != helper[order][:-1])
    out[order[new]] = True
    return out


def _sync_ops_inside(
    trace: Trace, catalog: Catalog, thread: IntArray, start: IntArray, end: IntArray
) -> IntArray:
    """Per range: catalogued sync operators starting in ``[start, end)`` on its thread."""
    table = trace.ranges
    out = np.zeros(len(thread), dtype=np.int64)
    names = table["name"]
    symbols = [s for s in np.unique(names).tolist() if catalog.is_sync("ops", trace.strings[s])]
    is_op = np.isin(names, symbols) & (table["kind"] == RangeKind.CPU_OP)
    # one blocking call is one op: aten::item runs aten::_local_scalar_dense inside it
    parent = table["parent"].astype(np.int64)
    inner = np.zeros(len(table), dtype=bool)
    inner[parent >= 0] = is_op[parent[parent >= 0]]
    ops = np.flatnonzero(is_op & ~inner)
    if not len(ops) or not len(thread):
        return out
    op_thread = table["thread"][ops].astype(np.int64)
    op_start = table["start"][ops].astype(np.int64)
    for t in np.intersect1d(np.unique(op_thread), thread).tolist():
        times = np.sort(op_start[op_thread == t])
        mine = np.flatnonzero(thread == t)
        out[mine] = np.searchsorted(times, end[mine], side="left") - np.searchsorted(
            times, start[mine], side="left"
        )
    return out


__all__ = ["host_time"]
