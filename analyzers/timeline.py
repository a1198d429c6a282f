"""The GPU timeline of every window, per rank: where the window's wall time went on the GPU.

For each window (a step, a variant window, the whole trace) and rank, with every GPU activity
*clipped to the window* (an NCCL kernel that runs past the step end counts only up to it):

============================ ==================================================================
``total``                    window length (end - start)
``computation``              union of kernels that are not NCCL kernels, and of memsets
``busy``                     union of every activity (kernels, memcpy, memset)
``exposed_communication``    union of NCCL kernels minus the part overlapped by computation
``exposed_memcpy``           busy minus computation minus exposed communication: memcpy time
                             overlapped by neither (= busy - computation when there is no NCCL)
``idle``                     total - busy
============================ ==================================================================

So ``computation + exposed_communication + exposed_memcpy = busy <= total``, exactly, in
integer ns. Why clip instead of assigning each activity to one window by its launch (as the
helper tables do): a union of unclipped activities can exceed the window, and summed over steps
gave "GPU busy per step" larger than the step.

Which interval is the window: for Kineto, a step's (or variant's) ``gpu_user_annotation`` when
the trace has one: the GPU-side mirror of the CPU range, from the first to the last GPU activity
the range launched; a CPU range ends when the CPU has *queued* the step, its GPU work runs
later. nsys exports (and Kineto without GPU annotations) use the CPU range; the whole-trace
window is the rank's trace span.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzers.intervals import interval_union, union_order
from analyzers.model import ActivityKind, Trace
from analyzers.report import GroupTimeline, Window, WindowBasis, WindowTimeline

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

COMMUNICATION_MARK = "nccl"
"""A kernel whose name contains this (any case) is communication: ``ncclDevKernel_*``,
``ncclKernel_*``. By kernel name, not by catalog helper, so the figure does not move when the
catalog's labels do."""


@dataclass(frozen=True, slots=True)
class GpuActivities:
    """The activity columns the decomposition needs, one row per GPU activity."""

    rank: IntArray
    start: IntArray
    end: IntArray
    kind: npt.NDArray[np.int8]
    communication: BoolArray
    """NCCL kernels (see ``COMMUNICATION_MARK``)."""

    @classmethod
    def of_trace(cls, trace: Trace, rank: IntArray) -> GpuActivities:
        """Columns of ``trace.activities``; ``rank`` is each row's rank (readers leave -1 where
        only the launch knows it, so the caller resolves it)."""
        acts = trace.activities
        kind = acts["kind"].astype(np.int8)
        marked = np.array(
            [COMMUNICATION_MARK in name.lower() for name in trace.strings.names], dtype=bool
        )
        names = acts["name"].astype(np.int64)
        nccl = marked[names] if len(marked) else np.zeros(len(acts), dtype=bool)
        return cls(
            rank=np.asarray(rank, dtype=np.int64),
            start=acts["start"].astype(np.int64),
            end=acts["end"].astype(np.int64),
            kind=kind,
            communication=nccl & (kind == ActivityKind.KERNEL),
        )


@dataclass(frozen=True, slots=True)
class TimelineWindow:
    """A window as the timeline measures it: the interval and where it came from."""

    window: Window
    start_ns: int
    end_ns: int
    basis: WindowBasis


def _pairs(
    starts: IntArray, ends: IntArray, act_start: IntArray, act_end: IntArray
) -> tuple[IntArray, IntArray]:
    """(activity row, window index) for every activity overlapping a window by more than 0 ns.

    Half-open intervals: an activity ending exactly at a window's start does not overlap it.
    Disjoint windows (the usual steps of one group) are matched with two binary searches per
    activity; overlapping ones window by window.
    """
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    if len(s) and bool(np.all(e[:-1] <= s[1:])):
        first = np.searchsorted(e, act_start, side="right")  # first window ending after start
        last = np.searchsorted(s, act_end, side="left") - 1  # last window starting before end
        count = np.maximum(last - first + 1, 0)
        rows = np.repeat(np.arange(len(act_start), dtype=np.int64), count)
        offset = np.arange(len(rows), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        slot = np.repeat(first, count) + offset
        return rows, order[slot].astype(np.int64)
    row_parts, win_parts = [], []
    for w in range(len(starts)):
        hit = np.flatnonzero((act_start < ends[w]) & (act_end > starts[w]))
        row_parts.append(hit.astype(np.int64))
        win_parts.append(np.full(len(hit), w, dtype=np.int64))
    if not row_parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(row_parts), np.concatenate(win_parts)


def _clipped(
    windows: Sequence[TimelineWindow], acts: GpuActivities
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """(window index, clipped start, clipped end, activity row) of every activity-window overlap
    on the window's own rank."""
    segs, starts, ends, rows = [], [], [], []
    by_rank: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        by_rank.setdefault(w.window.rank, []).append(i)
    valid = acts.end > acts.start  # zero-length rows cover nothing
    for rank, ids in by_rank.items():
        mine = np.flatnonzero((acts.rank == rank) & valid)
        w_start = np.array([windows[i].start_ns for i in ids], dtype=np.int64)
        w_end = np.array([windows[i].end_ns for i in ids], dtype=np.int64)
        row, slot = _pairs(w_start, w_end, acts.start[mine], acts.end[mine])
        row = mine[row]
        segs.append(np.asarray(ids, dtype=np.int64)[slot])
        starts.append(np.maximum(acts.start[row], w_start[slot]))
        ends.append(np.minimum(acts.end[row], w_end[slot]))
        rows.append(row)
    if not segs:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, empty
    return np.concatenate(segs), np.concatenate(starts), np.concatenate(ends), np.concatenate(rows)


def decompose(windows: Sequence[TimelineWindow], acts: GpuActivities) -> list[WindowTimeline]:
    """The timeline parts of each window (same order as ``windows``)."""
    n = len(windows)
    seg, start, end, row = _clipped(windows, acts)
    order = union_order(seg, start)  # one sort for the three unions below
    seg, start, end, row = seg[order], start[order], end[order], row[order]
    kind = acts.kind[row]
    nccl = acts.communication[row]
    computation = ((kind == ActivityKind.KERNEL) & ~nccl) | (kind == ActivityKind.MEMSET)
    with_nccl = computation | nccl

    def union(mask: BoolArray) -> IntArray:
        return interval_union(seg[mask], start[mask], end[mask], n, presorted=True)[0]

    comp, comp_nccl = union(computation), union(with_nccl)
    busy = interval_union(seg, start, end, n, presorted=True)[0]
    out = []
    for i, w in enumerate(windows):
        total = w.end_ns - w.start_ns
        out.append(
            WindowTimeline(
                rank=w.window.rank,
                window=w.window.group or w.window.name,
                name=w.window.name,
                index=w.window.index,
                basis=w.basis,
                start_ns=w.start_ns,
                end_ns=w.end_ns,
                total_ns=total,
                computation_ns=int(comp[i]),
                busy_ns=int(busy[i]),
                exposed_communication_ns=int(comp_nccl[i] - comp[i]),
                exposed_memcpy_ns=int(busy[i] - comp_nccl[i]),
                idle_ns=total - int(busy[i]),
            )
        )
    return out


def _gpu_annotation_intervals(trace: Trace, rank: int, name: str) -> list[tuple[int, int]]:
    """The GPU annotations of ``name`` on ``rank``, one interval per CPU range: Kineto writes
    one row per stream the range touched, all with the CPU range's External id."""
    table = trace.gpu_ranges
    symbol = trace.strings.lookup(name)
    if symbol is None or len(table) == 0:
        return []
    rows = table[(table["name"] == symbol) & (table["rank"] == rank)]
    merged: dict[int, tuple[int, int]] = {}
    for i, r in enumerate(rows.tolist()):
        ext = r[6] if r[6] >= 0 else -1 - i
        lo, hi = merged.get(ext, (r[3], r[4]))
        merged[ext] = (min(lo, r[3]), max(hi, r[4]))
    return sorted(merged.values())


def timeline_windows(
    trace: Trace, windows: Sequence[Window]
) -> tuple[list[TimelineWindow], list[str]]:
    """The interval each window is measured over, and notes where a GPU annotation was expected
    but could not be paired.

    A CPU window's GPU annotations are paired with it in order (k-th CPU range of a name on a
    rank with the k-th annotation interval of that name), only when both counts agree and no
    annotation starts before its CPU range (GPU work cannot precede its launch); otherwise the
    CPU range is used for every window of that name, with a note.
    """
    by_name: dict[tuple[int, str], list[int]] = {}
    for i, w in enumerate(windows):
        if w.kind != "trace":
            by_name.setdefault((w.rank, w.name), []).append(i)
    gpu: dict[int, tuple[int, int]] = {}
    notes = []
    for (rank, name), ids in by_name.items():
        intervals = _gpu_annotation_intervals(trace, rank, name)
        if not intervals:
            continue
        ids = sorted(ids, key=lambda i: windows[i].start_ns)
        fits = len(intervals) == len(ids) and all(
            iv[0] >= windows[i].start_ns for iv, i in zip(intervals, ids, strict=True)
        )
        if not fits:
            notes.append(
                f"rank {rank}: {len(intervals)} GPU annotation(s) {name!r} for {len(ids)} CPU "
                f"range(s): its GPU timeline uses the CPU ranges"
            )
            continue
        gpu.update(dict(zip(ids, intervals, strict=True)))
    out = []
    for i, w in enumerate(windows):
        if i in gpu:
            out.append(TimelineWindow(w, gpu[i][0], gpu[i][1], WindowBasis.GPU_ANNOTATION))
        else:
            basis = WindowBasis.TRACE if w.kind == "trace" else WindowBasis.CPU_RANGE
            out.append(TimelineWindow(w, w.start_ns, w.end_ns, basis))
    return out, notes


def window_timelines(
    trace: Trace, windows: Sequence[Window], rank: IntArray
) -> tuple[list[WindowTimeline], list[str]]:
    """Decomposition of every window of ``windows`` (all groups), plus pairing notes.

    Windows of different groups may overlap (an arm and the steps inside it), so each group is
    decomposed on its own.
    """
    measured, notes = timeline_windows(trace, windows)
    acts = GpuActivities.of_trace(trace, rank)
    groups: dict[str, list[int]] = {}
    for i, w in enumerate(windows):
        groups.setdefault(w.group or w.name, []).append(i)
    result: list[WindowTimeline | None] = [None] * len(windows)
    for ids in groups.values():
        for i, parts in zip(ids, decompose([measured[i] for i in ids], acts), strict=True):
            result[i] = parts
    return [r for r in result if r is not None], notes


_PARTS = (
    "total_ns",
    "computation_ns",
    "busy_ns",
    "exposed_memcpy_ns",
    "exposed_communication_ns",
    "idle_ns",
)


def group_timelines(
    per_window: Sequence[WindowTimeline], steps: Mapping[tuple[int, str], int]
) -> list[GroupTimeline]:
    """Sum the windows of each (rank, group); ``steps`` gives the step count to divide by."""
    sums: dict[tuple[int, str], list[WindowTimeline]] = {}
    for w in per_window:
        sums.setdefault((w.rank, w.window), []).append(w)
    out = []
    for (rank, group), items in sums.items():
        basis = Counter(w.basis for w in items).most_common(1)[0][0]
        totals = {part: sum(getattr(w, part) for w in items) for part in _PARTS}
        out.append(
            GroupTimeline(
                rank=rank,
                window=group,
                steps=steps.get((rank, group), len(items)),
                windows=len(items),
                basis=basis,
                **totals,
            )
        )
    return out


__all__ = [
    "COMMUNICATION_MARK",
    "GpuActivities",
    "TimelineWindow",
    "decompose",
    "group_timelines",
    "timeline_windows",
    "window_timelines",
]
