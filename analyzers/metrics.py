"""Per-rank, per-window-group numbers: helper launches and GPU time, stream busy time and gaps,
host-blocking calls, rank totals, cross-rank imbalance and a decimated timeline.

Why activities are placed by *launch* time: a kernel runs on the GPU after its step's CPU work
moved on, sometimes into the next window; the launch is what the window's code caused. An
activity without a launch falls back to its GPU start.

All aggregation is numpy (``bincount``, segmented ``maximum.accumulate``); the Python loops run
over window groups, ranks and helpers, never over events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from analyzers.attribution import (
    MATCHED_BY_LABELS,
    Attribution,
    RangeHelpers,
    RangeIndex,
    factorize,
)
from analyzers.catalog import Catalog
from analyzers.intervals import GAP_THRESHOLD_NS, interval_union
from analyzers.kernels import KernelTables, device_figures
from analyzers.model import ActivityKind, SymbolTable, Trace, launch_calls, truncated_name
from analyzers.report import (
    UNATTRIBUTED,
    Category,
    DeviceFigures,
    GroupTimeline,
    HelperStat,
    HostSyncStat,
    Imbalance,
    KernelStat,
    RankSummary,
    StreamStat,
    Timeline,
    TimelineEvent,
    TimelineStep,
    Window,
    WindowTimeline,
)
from analyzers.syncs import HostSyncs, host_syncs
from analyzers.timeline import GpuActivities, GpuTimeline, group_timelines, window_timelines
from analyzers.windows import WHOLE_TRACE, group_names

TIMELINE_LIMIT = 2000
TIMELINE_NAME_BUDGET = 256 * 1024
"""Characters of distinct activity names one timeline spells out in full (the real TE traces
need under 10,000); past it a new name is cut to ``TIMELINE_SHORT_NAME`` characters, and so is
any name over ``TIMELINE_LONG_NAME`` (their longest is 1,010): 5,000 distinct 4 KB names had
drawn 8 MB of names (issue 24, item 6). Each event still carries its name, so a timeline's
names are at most ``TIMELINE_LIMIT`` x ``TIMELINE_LONG_NAME`` characters per rank."""
TIMELINE_SHORT_NAME = 120
TIMELINE_LONG_NAME = 1024

IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class Metrics:
    """Everything ``findings`` and the report need, keyed by (rank, window group)."""

    windows: list[Window]
    groups: list[str]
    steps: dict[tuple[int, str], int]
    helpers: list[HelperStat] = field(default_factory=list)
    streams: list[StreamStat] = field(default_factory=list)
    rank_summaries: list[RankSummary] = field(default_factory=list)
    imbalance: list[Imbalance] = field(default_factory=list)
    host_syncs: list[HostSyncStat] = field(default_factory=list)
    timeline: Timeline | None = None
    other_timelines: list[Timeline] = field(default_factory=list)
    """The same dashboard timeline for every other step group (the run page links idle causes
    of each group to its gaps)."""
    devices: list[DeviceFigures] = field(default_factory=list)
    kernels: list[KernelStat] = field(default_factory=list)
    durations_ms: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    window_timelines: list[WindowTimeline] = field(default_factory=list)
    gpu_timeline: list[GroupTimeline] = field(default_factory=list)
    gpu: GpuTimeline | None = None
    """The measured windows and clipped activities behind ``window_timelines`` (the account
    reuses them)."""
    syncs: HostSyncs | None = None
    """The trace's blocking calls and sync operator ranges (the account reuses them)."""
    notes: list[str] = field(default_factory=list)
    """What the metrics could not do as intended (a GPU annotation that could not be paired)."""

    def helper_stats(self, group: str, helper: str) -> list[HelperStat]:
        """The helper's rows in one group, one per rank that has it."""
        return [h for h in self.helpers if h.window == group and h.helper == helper]

    def ranks_of(self, group: str) -> list[int]:
        """Ranks with at least one window of the group."""
        return sorted({rank for rank, g in self.steps if g == group})


class PointsByRank:
    """Points (rank, instant) split by rank once, for placing them in several window groups:
    each group would otherwise scan all points once per rank. Each rank's points are kept in
    time order: binary searches of sorted queries walk the windows cache-friendly, several
    times faster than the same searches in row order on millions of points."""

    __slots__ = ("_rank", "_split", "_time")

    def __init__(self, points_rank: IntArray, points_time: IntArray) -> None:
        self._rank, self._time = points_rank, points_time
        self._split: dict[int, tuple[IntArray, IntArray]] = {}

    def __len__(self) -> int:
        return len(self._time)

    def of(self, rank: int) -> tuple[IntArray, IntArray]:
        """Row indices of the rank's points and their instants, in time order."""
        if rank not in self._split:
            here = np.flatnonzero(self._rank == rank)
            times = self._time[here]
            if len(times) > 1 and not bool(np.all(times[1:] >= times[:-1])):
                order = np.argsort(times, kind="stable")
                here, times = here[order], times[order]
            self._split[rank] = (here, times)
        return self._split[rank]


def assign_windows(
    points_rank: IntArray,
    points_time: IntArray,
    windows: Sequence[Window],
    *,
    split: PointsByRank | None = None,
) -> IntArray:
    """Index into ``windows`` (all of one group) of the window holding each point, -1 if none.

    ``split``: the same points as a ``PointsByRank`` when they are placed in several groups.
    """
    points = split if split is not None else PointsByRank(points_rank, points_time)
    out = np.full(len(points), -1, dtype=np.int64)
    for rank in sorted({w.rank for w in windows}):
        idx = [i for i, w in enumerate(windows) if w.rank == rank]
        starts = np.array([windows[i].start_ns for i in idx], dtype=np.int64)
        ends = np.array([windows[i].end_ns for i in idx], dtype=np.int64)
        order = np.argsort(starts, kind="stable")
        starts, ends, ids = starts[order], ends[order], np.asarray(idx, dtype=np.int64)[order]
        here, times = points.of(rank)
        slot = np.searchsorted(starts, times, side="right") - 1
        ok = slot >= 0
        slot = np.maximum(slot, 0)
        ok &= times <= ends[slot]
        out[here[ok]] = ids[slot[ok]]
    return out


@dataclass(frozen=True, slots=True)
class _Columns:
    """Per-activity columns every window group reads, taken from the structured table once."""

    duration: IntArray
    is_kernel: npt.NDArray[np.bool_]
    start: IntArray
    end: IntArray
    stream: IntArray
    """Code of the activity's (rank, device, stream), in the sorted order of ``streams``."""
    streams: npt.NDArray[np.int64]
    """Distinct (rank, device, stream) rows, sorted."""


def _columns(trace: Trace, rank: IntArray) -> _Columns:
    acts = trace.activities
    start, end = acts["start"].astype(np.int64), acts["end"].astype(np.int64)
    streams, stream = _combined_codes(rank, acts["device"], acts["stream"])
    return _Columns(
        duration=end - start,
        is_kernel=acts["kind"] == ActivityKind.KERNEL,
        start=start,
        end=end,
        stream=stream.astype(np.int64),
        streams=streams,
    )


@dataclass(slots=True)
class _Placed:
    """Activities of one window group: which window each sits in (-1: outside)."""

    group: str
    windows: list[Window]
    window: IntArray
    cols: _Columns


def activity_points(trace: Trace, att: Attribution) -> tuple[IntArray, IntArray]:
    """Per activity: its rank (through its launch where the reader left -1) and the instant it
    is placed at, its launch start (its GPU start when no launch row joined)."""
    acts = trace.activities
    rank = acts["rank"].astype(np.int64)
    has = att.launch >= 0
    time = acts["start"].astype(np.int64).copy()
    time[has] = trace.launches["start"][att.launch[has]]
    unknown = rank < 0
    if unknown.any() and has.any():
        rank[unknown & has] = trace.launches["rank"][att.launch[unknown & has]]
    return rank, time


def gpu_activities(
    trace: Trace, att: Attribution, points: tuple[IntArray, IntArray] | None = None
) -> GpuActivities:
    """The timeline's activity columns, with each activity's rank and launch start resolved
    through its launch row (``points``: ``activity_points(trace, att)`` when already known)."""
    rank, time = points if points is not None else activity_points(trace, att)
    return GpuActivities.of_trace(trace, rank, np.where(att.launch >= 0, time, -1))


def _helper_stats(
    trace: Trace,
    att: Attribution,
    placed: _Placed,
    steps: dict[tuple[int, str], int],
    calls: dict[tuple[int, int], tuple[int, int, int]],
) -> list[HelperStat]:
    inside = placed.window >= 0
    if not inside.any():
        return []
    w_rank = np.array([w.rank for w in placed.windows], dtype=np.int64)[placed.window[inside]]
    helper = att.helper[inside].astype(np.int64)
    duration = placed.cols.duration[inside]
    is_kernel = placed.cols.is_kernel[inside]
    how = att.matched_by[inside].astype(np.int64)
    launch = att.launch[inside]
    # One code per (rank, helper); every figure is a bincount over it, no per-helper masks.
    rank_values = np.unique(w_rank)
    n_helpers = len(att.helper_names) + 1  # helper ids -1 .. n-1 shift to 0 .. n
    pair = np.searchsorted(rank_values, w_rank) * n_helpers + helper + 1
    n_pairs = len(rank_values) * n_helpers
    activities = np.bincount(pair, minlength=n_pairs)
    kernels = np.bincount(pair[is_kernel], minlength=n_pairs)
    gpu_time = np.zeros(n_pairs, dtype=np.int64)
    np.add.at(gpu_time, pair, duration)
    n_labels = len(MATCHED_BY_LABELS)
    labels = np.bincount(pair * n_labels + how, minlength=n_pairs * n_labels)
    label = labels.reshape(n_pairs, n_labels).argmax(axis=1)  # the most frequent, lowest on ties
    # distinct launch rows: one sort of (pair, launch) codes
    has = launch >= 0
    span = int(launch.max(initial=0)) + 1
    codes = np.sort(pair[has] * span + launch[has])  # a sort: hashing many distinct ids is slower
    distinct = codes[np.append(True, codes[1:] != codes[:-1])] if len(codes) else codes
    launches = np.bincount(distinct // span, minlength=n_pairs)
    out = []
    for p in np.flatnonzero(activities).tolist():
        rank, h = int(rank_values[p // n_helpers]), p % n_helpers - 1
        n_calls, host, first_host = calls.get((rank, h), (0, 0, 0))
        out.append(
            HelperStat(
                rank=rank,
                window=placed.group,
                steps=steps[(rank, placed.group)],
                helper=att.name_of(h),
                category=att.category_of(h),
                launches=int(launches[p]),
                activities=int(activities[p]),
                kernels=int(kernels[p]),
                gpu_time_ns=int(gpu_time[p]),
                matched_by=MATCHED_BY_LABELS[int(label[p])],
                calls=n_calls,
                host_time_ns=host,
                first_call_host_ns=first_host,
            )
        )
    return out


def _combined_codes(*columns: IntArray) -> tuple[npt.NDArray[np.int64], IntArray]:
    """Distinct rows of a few low-cardinality columns and each input's row index into them.

    Equivalent to ``np.unique(np.stack(columns, 1), axis=0, return_inverse=True)`` but through
    one int64 code per row, which avoids numpy's slow structured sort on millions of rows.
    """
    codes = [factorize(c.astype(np.int64))[0] for c in columns]
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    for code in codes:
        combined = combined * (int(code.max(initial=0)) + 1) + code
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    keys = np.stack([c[first] for c in columns], axis=1).astype(np.int64)
    return keys, inverse.reshape(-1)


@dataclass(slots=True)
class _Calls:
    """Outermost catalogued ranges of the trace (host-side helper calls), computed once for all
    window groups; ``first`` marks each (rank, helper)'s first call in the whole trace."""

    rank: IntArray
    helper: IntArray
    start: IntArray
    duration: IntArray
    first: npt.NDArray[np.bool_]


def _outermost_calls(trace: Trace, ranges: RangeHelpers, rank_of_range: IntArray) -> _Calls:
    index = ranges.specific
    rows = index.rows
    empty = np.empty(0, dtype=np.int64)
    if len(rows) == 0:
        return _Calls(empty, empty, empty, empty, np.empty(0, dtype=bool))
    helper = ranges.helper[rows].astype(np.int64)
    parent_helper = np.where(
        index.parent >= 0, ranges.helper[rows[np.maximum(index.parent, 0)]], -1
    )
    outermost = parent_helper != helper
    rows, helper = rows[outermost], helper[outermost]
    start = trace.ranges["start"][rows].astype(np.int64)
    duration = (trace.ranges["end"][rows] - trace.ranges["start"][rows]).astype(np.int64)
    rank = rank_of_range[rows]
    _, key = _combined_codes(rank, helper)
    earliest = np.lexsort((start, key))
    new = np.ones(len(earliest), dtype=bool)
    new[1:] = key[earliest][1:] != key[earliest][:-1]
    first = np.zeros(len(rows), dtype=bool)
    first[earliest[new]] = True
    return _Calls(rank, helper, start, duration, first)


def _helper_calls(
    calls: _Calls, group_windows: list[Window]
) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(rank, helper) -> (outermost catalogued calls, host ns, host ns of the rank's first call
    of the helper in the whole trace if it is one of them) in the group's windows."""
    if len(calls.rank) == 0:
        return {}
    w = assign_windows(calls.rank, calls.start, group_windows)
    inside = w >= 0
    if not inside.any():
        return {}
    keys, inverse = _combined_codes(calls.rank[inside], calls.helper[inside])
    count = np.bincount(inverse, minlength=len(keys))
    dur = calls.duration[inside]
    host = np.zeros(len(keys), dtype=np.int64)
    np.add.at(host, inverse, dur)
    first = np.zeros(len(keys), dtype=np.int64)
    np.add.at(first, inverse, np.where(calls.first[inside], dur, 0))
    return {
        (int(rank), int(h)): (int(c), int(t), int(f))
        for (rank, h), c, t, f in zip(
            keys.tolist(), count.tolist(), host.tolist(), first.tolist(), strict=True
        )
    }


def _stream_stats(placed: _Placed) -> list[StreamStat]:
    cols = placed.cols
    inside = np.flatnonzero(placed.window >= 0)
    if len(inside) == 0:
        return []
    window = placed.window[inside]
    start, end = cols.start[inside], cols.end[inside]
    # the group's streams: the trace-wide (rank, device, stream) codes present here, renumbered
    # densely in the same sorted order (a placed activity's rank is its window's)
    code = cols.stream[inside]
    present = np.bincount(code, minlength=len(cols.streams)) > 0
    stream_keys = cols.streams[present]
    stream_id = (np.cumsum(present) - 1)[code]
    n_s, n_w = len(stream_keys), len(placed.windows)
    busy, gaps, gap_ns = interval_union(stream_id * n_w + window, start, end, n_s * n_w)
    counts = np.bincount(stream_id, minlength=n_s)
    first = np.full(n_s, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n_s, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, stream_id, start)
    np.maximum.at(last, stream_id, end)
    per_stream = [x.reshape(n_s, n_w).sum(axis=1) for x in (busy, gaps, gap_ns)]
    return [
        StreamStat(
            rank=r,
            window=placed.group,
            device=device,
            stream=stream,
            activities=int(counts[sid]),
            busy_ns=int(per_stream[0][sid]),
            gaps=int(per_stream[1][sid]),
            gap_ns=int(per_stream[2][sid]),
            first_ns=int(first[sid]),
            last_ns=int(last[sid]),
        )
        for sid, (r, device, stream) in enumerate(stream_keys.tolist())
    ]


def _rank_summaries(
    trace: Trace,
    att: Attribution,
    placed: _Placed,
    steps: dict[tuple[int, str], int],
    timelines: Sequence[GroupTimeline],
    launch_points: tuple[IntArray, IntArray],
    launch_split: PointsByRank,
) -> list[RankSummary]:
    """Per rank: busy and compute-busy from the clipped GPU timeline (so busy <= the windows),
    counts from the activities placed in the group's windows by launch time; ``launch_points``
    are the (rank, start) of the launch calls (``_launch_points``, computed once per trace)."""
    w_rank = np.array([w.rank for w in placed.windows], dtype=np.int64)
    clipped = {t.rank: t for t in timelines if t.window == placed.group}
    in_window = assign_windows(*launch_points, placed.windows, split=launch_split)
    per_window = np.bincount(in_window[in_window >= 0], minlength=len(placed.windows))
    launch_counts: Counter[int] = Counter()
    for window_rank, n in zip(w_rank.tolist(), per_window.tolist(), strict=True):
        launch_counts[window_rank] += n
    # per-window counts and sums (bincounts over the window index), then per rank
    inside = placed.window >= 0
    window = placed.window[inside]
    n_w = len(placed.windows)
    duration = placed.cols.duration[inside]
    per_w = {
        "activities": np.bincount(window, minlength=n_w),
        "kernels": np.bincount(window[placed.cols.is_kernel[inside]], minlength=n_w),
        "total": np.zeros(n_w, dtype=np.int64),
        "attributed": np.zeros(n_w, dtype=np.int64),
    }
    np.add.at(per_w["total"], window, duration)
    claimed = att.helper[inside] >= 0
    np.add.at(per_w["attributed"], window[claimed], duration[claimed])
    out = []
    for rank in sorted({w.rank for w in placed.windows}):
        mine = w_rank == rank
        sums = {name: int(values[mine].sum()) for name, values in per_w.items()}
        total = sums["total"]
        out.append(
            RankSummary(
                rank=rank,
                window=placed.group,
                steps=steps[(rank, placed.group)],
                span_ns=sum(w.end_ns - w.start_ns for w in placed.windows if w.rank == rank),
                gpu_busy_ns=clipped[rank].busy_ns if rank in clipped else 0,
                compute_busy_ns=clipped[rank].computation_ns if rank in clipped else 0,
                kernels=sums["kernels"],
                launches=int(launch_counts.get(rank, 0)),
                activities=sums["activities"],
                attributed_fraction=sums["attributed"] / total if total else 0.0,
            )
        )
    return out


def _launch_points(trace: Trace) -> tuple[IntArray, IntArray]:
    """(rank, start) of the trace's launch calls (not the host-sync calls), as int64 columns:
    taken once for all window groups, without copying whole launch rows."""
    calls = launch_calls(trace.launches)
    launches = trace.launches
    return (
        launches["rank"][calls].astype(np.int64),
        launches["start"][calls].astype(np.int64),
    )


def imbalance_of(summaries: Sequence[RankSummary]) -> list[Imbalance]:
    """Cross-rank spread (per step) of busy time, span and kernel count in one group."""
    if len(summaries) < 2:
        return []
    out = []
    for metric in ("gpu_busy_ns", "compute_busy_ns", "span_ns", "kernels"):
        per_rank = {s.rank: getattr(s, metric) / max(s.steps, 1) for s in summaries}
        values = np.array(list(per_rank.values()), dtype=float)
        low, mean = float(values.min()), float(values.mean())
        out.append(
            Imbalance(
                window=summaries[0].window,
                metric=metric,
                per_rank=per_rank,
                max_over_min=float(values.max() / low)
                if low > 0
                else float("inf")
                if values.max() > 0
                else 1.0,
                max_over_mean=float(values.max() / mean) if mean > 0 else 1.0,
            )
        )
    return out


def _host_syncs(
    trace: Trace,
    catalog: Catalog,
    att: Attribution,
    ranges: RangeHelpers,
    placed: _Placed,
    steps: dict[tuple[int, str], int],
    sync_ops: RangeIndex,
    rows: IntArray,
) -> list[HostSyncStat]:
    """Blocking calls per (rank, enclosing helper); each is labelled by the sync operator around
    it (``aten::_local_scalar_dense``) when the trace has one, else by its API name. ``rows``:
    ``HostSyncs.calls`` (the same for every group)."""
    launches = trace.launches
    if len(rows) == 0:
        return []
    w = assign_windows(
        launches["rank"][rows].astype(np.int64),
        launches["start"][rows].astype(np.int64),
        placed.windows,
    )
    rows, w = rows[w >= 0], w[w >= 0]
    claimed = ranges.specific.lookup(launches["thread"][rows], launches["start"][rows])
    helper = np.full(len(rows), -1, dtype=np.int64)  # a trace without ranges claims none
    hit = claimed >= 0
    helper[hit] = ranges.helper[claimed[hit]]
    op = sync_ops.lookup(launches["thread"][rows], launches["start"][rows])
    label = launches["api"][rows].astype(np.int64)
    named = op >= 0
    label[named] = trace.ranges["name"][op[named]]
    w_rank = np.array([placed.windows[i].rank for i in w], dtype=np.int64)
    out = []
    for rank in np.unique(w_rank).tolist():
        for h in np.unique(helper[w_rank == rank]).tolist():
            mask = (w_rank == rank) & (helper == h)
            sel = rows[mask]
            api = Counter(label[mask].tolist()).most_common(1)[0][0]
            kinds = Counter(trace.strings[int(a)] for a in launches["api"][sel].tolist())
            op_rows = np.unique(op[mask][named[mask]]).tolist()
            op_calls = Counter(trace.strings[int(trace.ranges["name"][r])] for r in op_rows)
            out.append(
                HostSyncStat(
                    rank=rank,
                    window=placed.group,
                    steps=steps[(rank, placed.group)],
                    helper=att.name_of(h),
                    calls=len(sel),
                    blocked_ns=int((launches["end"][sel] - launches["start"][sel]).sum()),
                    api=trace.strings[int(api)],
                    apis=dict(kinds.most_common()),
                    ops=dict(op_calls.most_common()),
                )
            )
    return out


class _TimelineNames:
    """Each distinct name of one timeline in full while ``TIMELINE_NAME_BUDGET`` lasts and it
    is at most ``TIMELINE_LONG_NAME`` long; else cut (``truncated_name``: its full length in
    the marker) to ``TIMELINE_SHORT_NAME``."""

    def __init__(self, strings: SymbolTable) -> None:
        self.strings = strings
        self.shown: dict[int, str] = {}
        self.left = TIMELINE_NAME_BUDGET

    def __call__(self, index: int) -> str:
        shown = self.shown.get(index)
        if shown is None:
            full = self.strings[index]
            if len(full) <= TIMELINE_SHORT_NAME or TIMELINE_LONG_NAME >= len(full) <= self.left:
                shown = full
                self.left -= len(full)
            else:
                shown = truncated_name(full, TIMELINE_SHORT_NAME)
            self.shown[index] = shown
        return shown


def _timeline(trace: Trace, att: Attribution, placed: _Placed, limit: int) -> Timeline:
    acts = trace.activities
    name_of = _TimelineNames(trace.strings)
    events: list[TimelineEvent] = []
    steps: list[TimelineStep] = []
    dropped = 0
    for rank in sorted({w.rank for w in placed.windows}):
        ids = [i for i, w in enumerate(placed.windows) if w.rank == rank]
        chosen = ids[len(ids) // 2]  # the middle step: away from warm-up and the last flush
        origin = placed.windows[chosen].start_ns
        drawn = placed.windows[chosen]
        steps.append(
            TimelineStep(rank=rank, window=drawn.name, index=drawn.index, origin_ns=origin)
        )
        rows = np.flatnonzero(placed.window == chosen)
        if len(rows) > limit:
            dropped += len(rows) - limit
            longest = np.argsort(acts["end"][rows] - acts["start"][rows], kind="stable")[-limit:]
            rows = np.sort(rows[longest])
        # columns as Python ints once, not a numpy scalar per field and row (up to 2000 events
        # per rank and step group)
        columns = zip(
            acts["stream"][rows].astype(np.int64).tolist(),
            (acts["start"][rows].astype(np.int64) - origin).tolist(),
            (acts["end"][rows].astype(np.int64) - origin).tolist(),
            acts["name"][rows].tolist(),
            att.helper[rows].tolist(),
            strict=True,
        )
        for stream, start, end, name, h in columns:
            events.append(
                TimelineEvent(
                    rank=rank,
                    stream=stream,
                    start_ns=start,
                    end_ns=end,
                    name=name_of(name),
                    helper=att.name_of(h),
                    category=att.category_of(h),
                )
            )
    return Timeline(window=placed.group, limit=limit, dropped=dropped, events=events, steps=steps)


def compute_metrics(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: list[Window],
    *,
    timeline_limit: int = TIMELINE_LIMIT,
    steps_per_window: Mapping[str, int] | None = None,
) -> Metrics:
    """Aggregate attributed activities into every window group of ``windows``.

    ``steps_per_window`` (group -> steps) says how many steps one variant window holds when the
    trace marks none inside it; step counts multiply and window durations divide by it.
    """
    groups = group_names(windows)
    per_window = steps_per_window or {}
    steps: Counter[tuple[int, str]] = Counter()
    metrics = Metrics(windows=windows, groups=groups, steps={})
    for w in windows:
        group = w.group or w.name
        k = per_window.get(group, 1) if w.kind == "window" else 1
        steps[(w.rank, group)] += k
        metrics.durations_ms.setdefault((w.rank, group), []).extend(
            [(w.end_ns - w.start_ns) / 1e6 / k] * k
        )
    metrics.steps = dict(steps)
    metrics.syncs = syncs = host_syncs(trace, catalog, att)
    rank, time = activity_points(trace, att)
    metrics.gpu = window_timelines(trace, windows, gpu_activities(trace, att, (rank, time)))
    metrics.window_timelines, metrics.notes = metrics.gpu.timelines, list(metrics.gpu.notes)
    metrics.gpu_timeline = group_timelines(metrics.window_timelines, metrics.steps)
    metrics.devices = device_figures(trace, rank, att.launch)
    kernel_tables = KernelTables(trace, rank)
    range_rank = trace.ranges["rank"].astype(np.int64)
    launch_points = _launch_points(trace)
    launch_split = PointsByRank(*launch_points)
    activity_split = PointsByRank(rank, time)
    cols = _columns(trace, rank)
    outermost_calls = _outermost_calls(trace, ranges, range_rank)
    for group in groups:
        group_windows = [w for w in windows if (w.group or w.name) == group]
        where = assign_windows(rank, time, group_windows, split=activity_split)
        placed = _Placed(group, group_windows, where, cols)
        calls = _helper_calls(outermost_calls, group_windows)
        metrics.helpers += _helper_stats(trace, att, placed, metrics.steps, calls)
        metrics.streams += _stream_stats(placed)
        metrics.kernels += kernel_tables.table(placed.window >= 0, group, metrics.steps)
        summaries = _rank_summaries(
            trace, att, placed, metrics.steps, metrics.gpu_timeline, launch_points, launch_split
        )
        metrics.rank_summaries += summaries
        metrics.imbalance += imbalance_of(summaries)
        metrics.host_syncs += _host_syncs(
            trace, catalog, att, ranges, placed, metrics.steps, syncs.op_ranges, syncs.calls
        )
        if group != WHOLE_TRACE or len(groups) == 1:
            drawn = _timeline(trace, att, placed, timeline_limit)
            if metrics.timeline is None:
                metrics.timeline = drawn
            else:
                metrics.other_timelines.append(drawn)
    metrics.helpers.sort(key=lambda h: (groups.index(h.window), h.rank, -h.gpu_time_ns))
    return metrics


def per_step(stats: Sequence[HelperStat], attr: str = "activities") -> float:
    """Sum over ranks of a helper attribute divided by each rank's step count (the default,
    GPU activities, says whether the helper ran at all: kernels without a launch row count)."""
    return float(sum(getattr(s, attr) / max(s.steps, 1) for s in stats))


__all__ = [
    "GAP_THRESHOLD_NS",
    "UNATTRIBUTED",
    "Category",
    "Metrics",
    "PointsByRank",
    "activity_points",
    "assign_windows",
    "compute_metrics",
    "gpu_activities",
    "imbalance_of",
    "interval_union",
    "per_step",
]
