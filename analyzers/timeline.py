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

Which interval is the window: for Kineto, a step's (or variant's) GPU window when the trace has
its ``gpu_user_annotation``: from the annotation's start (the first GPU activity the range
launched on its own thread) to the end of the last GPU activity *launched inside the CPU range
on any thread of the rank* (the backward kernels the autograd thread launches run after the
annotation ends), or the annotation's end if that is later; the extension stops at the start
of the next window of the same (rank, group), so windows never overlap. A CPU range ends when
the CPU has *queued* the step, its GPU work runs later. On nsys exports a step is its CPU range
projected onto the GPU (first to last activity launched inside it, ``_projected``), as
``nsys stats`` projects NVTX ranges; so is a Kineto step with no GPU annotation to pair on a
rank that has GPU annotations (the profiler's record is incomplete: some or all of the steps'
``gpu_user_annotation`` events are missing; a report note names those steps). Variant windows,
steps that launched nothing and the steps of a Kineto rank without any GPU annotation (a
hand-made or converted trace) use the CPU range; the whole-trace window is the rank's trace
span.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from analyzers.intervals import union_order
from analyzers.model import ActivityKind, Trace
from analyzers.report import GroupTimeline, Window, WindowBasis, WindowTimeline
from analyzers.sweep import Union

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
    launched: IntArray
    """When the activity's launch call started (trace clock); -1: no launch row joined."""

    @classmethod
    def of_trace(cls, trace: Trace, rank: IntArray, launched: IntArray) -> GpuActivities:
        """Columns of ``trace.activities``; ``rank`` is each row's rank (readers leave -1 where
        only the launch knows it, so the caller resolves it), ``launched`` its launch start
        (-1 without one)."""
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
            launched=np.asarray(launched, dtype=np.int64),
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


@dataclass(frozen=True, slots=True)
class Clipped:
    """Every activity-window overlap on the window's own rank, clipped to the window, sorted by
    (window, clipped start) with ties in activity-row order (``union_order``). ``seg`` indexes
    the windows the table was made for, ``row`` is the activity's row."""

    seg: IntArray
    start: IntArray
    end: IntArray
    row: IntArray


def clip_to_windows(windows: Sequence[TimelineWindow], acts: GpuActivities) -> Clipped:
    """The clipped overlaps of ``acts`` with ``windows`` (see ``Clipped``): the one clipping
    the timeline and the account both measure."""
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
        return Clipped(empty, empty, empty, empty)
    seg, start = np.concatenate(segs), np.concatenate(starts)
    end, row = np.concatenate(ends), np.concatenate(rows)
    order = union_order(seg, start)
    return Clipped(seg[order], start[order], end[order], row[order])


@dataclass(frozen=True, slots=True)
class GroupUnions:
    """Per window of a group (segment ``i`` is window ``i``): the union of its computation,
    and of its computation and NCCL kernels. The decomposition measures them, and the account
    subtracts them from NCCL and memcpy time: one definition of both sets. (Not kept between
    the two: held from the metrics to the account, ~100 MB at 2M kernels made the stages in
    between fault in fresh memory for as long as rebuilding them takes.)"""

    computation: Union
    with_nccl: Union


def group_unions(acts: GpuActivities, clipped: Clipped) -> GroupUnions:
    """The unions of a group's clipped computation, and of its computation and NCCL."""
    seg, start, end, row = clipped.seg, clipped.start, clipped.end, clipped.row
    kind = acts.kind[row]
    nccl = acts.communication[row]
    computation = ((kind == ActivityKind.KERNEL) & ~nccl) | (kind == ActivityKind.MEMSET)

    def union(mask: BoolArray) -> Union:
        # a subset of rows in (window, start) order, taken with a mask, stays in that order
        return Union.of(seg[mask], start[mask], end[mask], in_order=True)

    return GroupUnions(union(computation), union(computation | nccl))


def decompose(
    windows: Sequence[TimelineWindow], acts: GpuActivities, clipped: Clipped | None = None
) -> list[WindowTimeline]:
    """The timeline parts of each window (same order as ``windows``); ``clipped`` is
    ``clip_to_windows(windows, acts)`` when the caller already has it."""
    c = clipped if clipped is not None else clip_to_windows(windows, acts)
    n = len(windows)
    unions = group_unions(acts, c)
    every = Union.of(c.seg, c.start, c.end, in_order=True)  # busy: the union of all of them
    comp, comp_nccl, busy = (u.lengths(n) for u in (unions.computation, unions.with_nccl, every))
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
                cpu_start_ns=w.window.start_ns,
                cpu_end_ns=w.window.end_ns,
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
    trace: Trace, windows: Sequence[Window], acts: GpuActivities
) -> tuple[list[TimelineWindow], list[str]]:
    """The interval each window is measured over, and notes where a GPU annotation was expected
    but could not be paired.

    A CPU window's GPU annotations are paired with it in order (k-th CPU range of a name on a
    rank with the k-th annotation interval of that name), only when both counts agree and no
    annotation starts before its CPU range (GPU work cannot precede its launch); otherwise the
    CPU range is used for every window of that name, with a note. A paired window then extends
    to the work launched inside its CPU range (``_launched_extension``).
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
                f"range(s): not paired"
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
    if trace.format == "nsys":
        return _projected(out, acts), notes
    # Kineto: a rank with GPU annotations but none for a step lost that step's annotation
    # (the profiler's record is incomplete); a rank without any keeps its CPU ranges
    annotated_ranks = set(np.unique(trace.gpu_ranges["rank"]).tolist())
    projected = _projected(out, acts, annotated_ranks)
    notes += _projection_notes(projected, gpu)
    return _launched_extension(projected, sorted(gpu), acts), notes


def _projection_notes(measured: list[TimelineWindow], annotated: Mapping[int, object]) -> list[str]:
    """Per (rank, group) of a Kineto trace: the steps measured over their projection because
    no GPU annotation was paired with them (a trace whose ``gpu_user_annotation`` events are
    missing for some or all steps)."""
    steps: dict[tuple[int, str], list[int]] = {}
    for i, m in enumerate(measured):
        if m.window.kind == "step":
            steps.setdefault((m.window.rank, m.window.group or m.window.name), []).append(i)
    notes = []
    for (rank, group), ids in steps.items():
        moved = [
            measured[i].window.name for i in ids if measured[i].basis is WindowBasis.GPU_PROJECTION
        ]
        if not moved:
            continue
        names = ", ".join(moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
        paired = sum(1 for i in ids if i in annotated)
        notes.append(
            f"rank {rank}: {len(moved)} of {len(ids)} {group!r} step(s) without a usable GPU "
            f"annotation ({names}; {paired} paired): each is measured over its CPU range "
            "projected onto the GPU (first to last activity launched inside it), as on nsys"
        )
    return notes


def _projected(
    measured: list[TimelineWindow], acts: GpuActivities, ranks: set[int] | None = None
) -> list[TimelineWindow]:
    """Step windows measured over their CPU range (every step on nsys; a Kineto step with no
    GPU annotation paired) projected onto the GPU (``WindowBasis.GPU_PROJECTION``).

    Step ``i`` (CPU range ``[cs, ce]`` on rank ``r``) becomes ``[first, min(last, next))``:
    ``first``/``last`` the earliest start and latest end of the rank's activities whose launch
    started in ``[cs, ce]``, ``next`` the start of the next projected or GPU-annotated window
    of the same (rank, group). Why: a CPU range ends when the CPU has queued the step; on an
    eager job the GPU can run a whole step behind, and the CPU range would measure the previous
    step's kernels. A step that launched nothing keeps its CPU range. ``ranks``: only the
    steps of these ranks (None: every rank).
    """
    has_launch = acts.launched >= 0
    by_rank: dict[int, tuple[IntArray, IntArray, IntArray]] = {}
    spans: dict[int, tuple[int, int]] = {}
    for i, m in enumerate(measured):
        rank = m.window.rank
        if m.window.kind != "step" or m.basis != WindowBasis.CPU_RANGE:
            continue
        if ranks is not None and rank not in ranks:
            continue
        if rank not in by_rank:
            mine = np.flatnonzero(has_launch & (acts.rank == rank))
            order = mine[np.argsort(acts.launched[mine], kind="stable")]
            ends = acts.end[order]
            by_rank[rank] = (acts.launched[order], acts.start[order], ends)
        launched, starts, ends = by_rank[rank]
        lo = int(np.searchsorted(launched, m.window.start_ns, side="left"))
        hi = int(np.searchsorted(launched, m.window.end_ns, side="right"))
        if hi > lo:
            spans[i] = (int(starts[lo:hi].min()), int(ends[lo:hi].max()))
    out = list(measured)
    # a projection stops at the next GPU-measured window of its group: projected, or paired
    # with its GPU annotation (Kineto steps whose annotation is missing sit between those)
    opens = {i: first for i, (first, _) in spans.items()}
    opens.update(
        (i, m.start_ns) for i, m in enumerate(measured) if m.basis is WindowBasis.GPU_ANNOTATION
    )
    groups: dict[tuple[int, str], list[int]] = {}
    for i in opens:
        w = measured[i].window
        groups.setdefault((w.rank, w.group or w.name), []).append(i)
    for ids in groups.values():
        ids.sort(key=lambda i: opens[i])
        limits = [opens[b] for b in ids[1:]] + [np.iinfo(np.int64).max]
        for i, limit in zip(ids, limits, strict=True):
            if i not in spans:
                continue
            first, last = spans[i]
            end = max(first, min(last, int(limit)))
            out[i] = TimelineWindow(measured[i].window, first, end, WindowBasis.GPU_PROJECTION)
    return out


def _launched_extension(
    measured: list[TimelineWindow], annotated: Sequence[int], acts: GpuActivities
) -> list[TimelineWindow]:
    """GPU-annotated windows extended to the work their CPU range launched on any thread.

    Window ``i`` (CPU range ``[cs, ce]`` on rank ``r``, annotation ``[gs, ge)``) becomes
    ``[gs, max(ge, min(last, next)))``: ``last`` is the latest end of the rank's activities
    whose launch started in ``[cs, ce]`` (both ends included, as the helper tables place
    activities), ``next`` the start of the next window of the same (rank, group) by start (no
    limit for the last one). So the window keeps its annotation and never reaches into the
    next window.
    """
    if not annotated:
        return measured
    out = list(measured)
    has_launch = acts.launched >= 0
    by_rank: dict[int, tuple[IntArray, IntArray]] = {}
    neighbours: dict[tuple[int, str], list[int]] = {}
    for i, m in enumerate(measured):
        if m.basis != WindowBasis.TRACE:
            neighbours.setdefault((m.window.rank, m.window.group or m.window.name), []).append(i)
    following: dict[int, int] = {}
    for ids in neighbours.values():
        ids.sort(key=lambda i: (measured[i].start_ns, i))
        following.update({a: measured[b].start_ns for a, b in pairwise(ids)})
    for i in annotated:
        m = measured[i]
        rank = m.window.rank
        if rank not in by_rank:
            mine = np.flatnonzero(has_launch & (acts.rank == rank))
            order = mine[np.argsort(acts.launched[mine], kind="stable")]
            by_rank[rank] = (acts.launched[order], acts.end[order])
        launched, ends = by_rank[rank]
        lo = int(np.searchsorted(launched, m.window.start_ns, side="left"))
        hi = int(np.searchsorted(launched, m.window.end_ns, side="right"))
        if hi <= lo:
            continue
        last = min(int(ends[lo:hi].max()), following.get(i, np.iinfo(np.int64).max))
        if last > m.end_ns:
            out[i] = TimelineWindow(m.window, m.start_ns, last, m.basis)
    return out


@dataclass(frozen=True, slots=True)
class GroupClip:
    """One window group's windows as measured and its activities clipped to them."""

    ids: list[int]
    """Indices of the group's windows in the windows given to ``window_timelines``."""
    windows: list[TimelineWindow]
    clipped: Clipped
    """``clip_to_windows(windows, acts)``: ``seg`` indexes ``windows``."""


@dataclass(frozen=True, slots=True)
class GpuTimeline:
    """The decomposition of every window and what it was computed from, kept so the account
    (``analyzers.account``) measures the same windows and clipped activities without redoing
    them."""

    windows: list[TimelineWindow]
    """Every window as measured, in the order given."""
    acts: GpuActivities
    groups: dict[str, GroupClip]
    timelines: list[WindowTimeline]
    """Same order as ``windows``."""
    notes: list[str]


def window_timelines(trace: Trace, windows: Sequence[Window], acts: GpuActivities) -> GpuTimeline:
    """Decomposition of every window of ``windows`` (all groups), plus pairing notes.

    Windows of different groups may overlap (an arm and the steps inside it), so each group is
    clipped and decomposed on its own.
    """
    measured, notes = timeline_windows(trace, windows, acts)
    ids_of: dict[str, list[int]] = {}
    for i, w in enumerate(windows):
        ids_of.setdefault(w.group or w.name, []).append(i)
    result: list[WindowTimeline | None] = [None] * len(windows)
    groups = {}
    for group, ids in ids_of.items():
        mine = [measured[i] for i in ids]
        clipped = clip_to_windows(mine, acts)
        groups[group] = GroupClip(ids, mine, clipped)
        for i, parts in zip(ids, decompose(mine, acts, clipped), strict=True):
            result[i] = parts
    timelines = [r for r in result if r is not None]
    return GpuTimeline(measured, acts, groups, timelines, notes)


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
    "Clipped",
    "GpuActivities",
    "GpuTimeline",
    "GroupClip",
    "TimelineWindow",
    "clip_to_windows",
    "decompose",
    "group_timelines",
    "timeline_windows",
    "window_timelines",
]
