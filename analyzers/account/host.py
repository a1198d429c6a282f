"""What a CPU thread was doing at any instant: blocked in a sync, inside a helper, or elsewhere.

The account asks this for every idle gap of the GPU: the gap is split at every instant where the
launching thread's state changes (a range opens or closes, a sync call starts or ends), and each
piece is labelled by the state at its start, in this order:

1. **synchronisation**: inside a catalogued sync operator (``aten::_local_scalar_dense``, ...),
   a synchronising API call the reader kept (``cudaStreamSynchronize``, ``cudaMemcpy``), or a
   device-to-host copy from its launch until the copy ends (a D2H copy into pageable memory
   blocks the host until it is done). The label is the op or API; the detail names the
   innermost Python frame open at that instant, when the trace has stacks.
2. **host-bound**, the innermost catalogued range (a helper; specific ranges before fallback
   containers, as in attribution), else the innermost range of any other kind (NVTX,
   ``record_function``, operator; window and step ranges excluded: they are open across every
   gap), else the innermost Python frame, else "unannotated host".

Pieces are cut where a catalogued (helper) range or a sync opens or closes, so helper and sync
time is exact to the nanosecond; a stretch outside every helper is labelled by the innermost
other range (or Python frame) open at its start (a trace with stacks has one Python frame per
call and an NVTX range per operator: cutting at each would multiply the pieces for a label that
names no helper).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzers.attribution import Attribution, RangeHelpers, RangeIndex, factorize, symbol_table
from analyzers.catalog import Catalog
from analyzers.model import ActivityKind, RangeKind, Trace

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

UNANNOTATED = "unannotated host"


class LabelType:
    """How ``HostLabels.value`` is to be read (plain ints: they live in numpy arrays)."""

    HELPER = 0  # value: helper index of the catalog
    RANGE = 1  # value: SymbolTable id of a range name
    UNANNOTATED = 2  # value: -1
    SYNC = 3  # value: SymbolTable id of the sync op / API / copy name


@dataclass(frozen=True, slots=True)
class HostLabels:
    """Per queried instant: what the thread was doing (see the module docstring)."""

    type: IntArray
    value: IntArray
    detail: IntArray  # SymbolTable id of the innermost Python frame for syncs, else -1


_Columns = dict[str, npt.NDArray[np.int64]]


def _columns(trace: Trace) -> _Columns:
    """The range table's thread, start and end as contiguous arrays: a structured table's
    field is strided, and gathers from it cost about twice as much (measured at 2M kernels)."""
    return {k: np.ascontiguousarray(trace.ranges[k]) for k in ("thread", "start", "end")}


def _index(columns: _Columns, rows: IntArray) -> RangeIndex:
    return RangeIndex(columns["thread"][rows], columns["start"][rows], columns["end"][rows], rows)


@dataclass(frozen=True, slots=True)
class _SyncCalls:
    """Host intervals of sync API calls and D2H copies (one per launch row that is one)."""

    index: RangeIndex  # its rows index the arrays below
    label: IntArray  # symbol naming the call
    thread: IntArray
    start: IntArray
    end: IntArray


def _sync_calls(trace: Trace, catalog: Catalog, att: Attribution) -> _SyncCalls:
    """Sync API launch rows and D2H copy launches as host intervals, with their labels."""
    launches, acts = trace.launches, trace.activities
    api = launches["api"]
    api_rows = np.flatnonzero(_symbols(trace, api, lambda n: catalog.is_sync("apis", n))[api])
    rows = api_rows.astype(np.int64)
    extended = np.empty(0, dtype=np.int64)  # launch rows of blocking device-to-host copies
    copy_name = copy_end = extended
    copies = np.flatnonzero(acts["kind"] == ActivityKind.MEMCPY)
    if len(copies):
        names = acts["name"][copies]
        sync = _symbols(trace, names, lambda n: catalog.is_sync("memcpy", n))
        d2h = copies[sync[names] & (att.launch[copies] >= 0)]
        extended = att.launch[d2h].astype(np.int64)
        copy_name = acts["name"][d2h].astype(np.int64)
        copy_end = acts["end"][d2h].astype(np.int64)
        rows = np.union1d(rows, extended)
    # the copy names the call (after the API), a blocking copy's call lasts until it ends
    label = np.empty(len(rows), dtype=np.int64)
    label[np.searchsorted(rows, api_rows)] = api[api_rows]
    label[np.searchsorted(rows, extended)] = copy_name
    ends = launches["end"][rows].astype(np.int64)
    np.maximum.at(ends, np.searchsorted(rows, extended), copy_end)
    thread = launches["thread"][rows].astype(np.int64)
    start = launches["start"][rows].astype(np.int64)
    index = RangeIndex(thread, start, ends, np.arange(len(rows), dtype=np.int64))
    return _SyncCalls(index, label, thread, start, ends)


def _symbols(trace: Trace, column: npt.NDArray[np.int32], keep: Callable[[str], bool]) -> BoolArray:
    """Per symbol id (plus a trailing False): whether the name passes ``keep``, asked once
    for each symbol that occurs in ``column``."""
    table = symbol_table(column, len(trace.strings), lambda s: int(keep(trace.strings[s])))
    return np.append(table > 0, False)


class HostStates:
    """Lookups of every thread's state, built once per trace."""

    def __init__(
        self,
        trace: Trace,
        catalog: Catalog,
        att: Attribution,
        ranges: RangeHelpers,
        window_names: set[str],
    ) -> None:
        self._trace = trace
        self._ranges = ranges
        table = trace.ranges
        kind = table["kind"]
        names = table["name"]
        sync_op = _symbols(trace, names, lambda n: catalog.is_sync("ops", n))[names]
        sync_op_rows = np.flatnonzero(sync_op & (kind == RangeKind.CPU_OP))
        window = np.zeros(len(trace.strings) + 1, dtype=bool)
        window[[s for n in window_names if (s := trace.strings.lookup(n)) is not None]] = True
        window = window[names]
        other = (kind != RangeKind.PYTHON) & (kind != RangeKind.STEP) & ~window
        # Catalogued ranges are looked up first (``labels``): an instant the other index is
        # asked about lies in none of them, so leaving them out changes no answer.
        other[ranges.specific.rows] = False
        other[ranges.container.rows] = False
        self._table = _columns(trace)
        self._sync_ops = _index(self._table, sync_op_rows.astype(np.int64, copy=False))
        self._calls = _sync_calls(trace, catalog, att)
        self._any = _index(self._table, np.flatnonzero(other).astype(np.int64, copy=False))
        python = np.flatnonzero(kind == RangeKind.PYTHON).astype(np.int64, copy=False)
        self._python = _index(self._table, python)
        spans = self._cutting_spans()
        self._bounds = self._boundaries(spans)
        sizes = [len(b) for b in self._bounds.values()]
        self._flat_bounds = (
            np.concatenate(list(self._bounds.values())) if sizes else np.empty(0, dtype=np.int64)
        )
        starts = np.concatenate(([0], np.cumsum(sizes))).tolist()
        self._bound_offset = {t: int(o) for t, o in zip(self._bounds, starts, strict=False)}
        names_of = np.append(names.astype(np.int64), -1)
        helper_of = np.append(ranges.helper.astype(np.int64), -1)
        # The lookups whose ranges cut the pieces (``_boundaries``), in ``labels`` order; the
        # rest label what is left open.
        self._cutting: list[tuple[RangeIndex, int, IntArray]] = [
            (self._sync_ops, LabelType.SYNC, names_of),
            (self._calls.index, LabelType.SYNC, np.append(self._calls.label, -1)),
            (self._ranges.specific, LabelType.HELPER, helper_of),
            (self._ranges.container, LabelType.HELPER, helper_of),
        ]
        self._rest: list[tuple[RangeIndex, int, IntArray]] = [
            (self._any, LabelType.RANGE, names_of),
            (self._python, LabelType.RANGE, names_of),
        ]
        self._names_of = names_of
        self._intervals = self._interval_states(spans)

    def _cutting_spans(self) -> list[tuple[IntArray, IntArray, IntArray]]:
        """(thread, start, end) of the ranges that cut idle pieces: sync ops, sync calls and
        copies, specific and container helper ranges (the ``_cutting`` lookups' ranges)."""
        table = self._table
        spans = [(self._calls.thread, self._calls.start, self._calls.end)]
        for index in (self._sync_ops, self._ranges.specific, self._ranges.container):
            rows = index.rows
            spans.append((table["thread"][rows], table["start"][rows], table["end"][rows]))
        return spans

    def _boundaries(self, spans: list[tuple[IntArray, IntArray, IntArray]]) -> dict[int, IntArray]:
        """Per thread (ascending ids), the sorted distinct instants where its state can change:
        the starts and ends of ``spans``. Only helper and sync ranges cut: a stretch outside
        every helper is labelled by the innermost other range (or Python frame) open at its
        start."""
        thread = np.concatenate([t for t, _, _ in spans]).astype(np.int64, copy=False)
        if len(thread) == 0:
            return {}
        start = np.concatenate([s for _, s, _ in spans]).astype(np.int64, copy=False)
        end = np.concatenate([e for _, _, e in spans]).astype(np.int64, copy=False)
        (code,) = factorize(thread)  # few threads: codes in id order
        ids = np.zeros(int(code.max()) + 1, dtype=np.int64)
        ids[code] = thread
        out: dict[int, IntArray] = {}
        for j, thread_id in enumerate(ids.tolist()):
            mine = code == j
            times = np.concatenate((start[mine], end[mine]))
            times.sort()  # a sort: numpy's unique hashes
            keep = np.empty(len(times), dtype=bool)
            keep[0] = True
            np.not_equal(times[1:], times[:-1], out=keep[1:])
            out[thread_id] = times[keep]
        return out

    def _interval_states(self, spans: list[tuple[IntArray, IntArray, IntArray]]) -> _Intervals:
        """The cutting lookups' answer on every elementary interval of every thread.

        Thread ``t`` with boundaries ``b`` (``_boundaries``) has intervals ``k = 0..len(b)``,
        ``[b[k-1], b[k])``: no sync or helper range opens or closes strictly inside one, so the
        cutting lookups (``_cutting``) answer the same for every instant of it, except in an
        interval starting where a degenerate range (``end <= start``, which ``RangeIndex``
        treats as ``[start, start + 1)``) starts: there only its first instant is known.
        Interval 0 lies before every cutting range. The answers are looked up on first use
        (``_resolve``: about half the intervals hold an idle piece), keys in sorted order,
        instead of once per idle piece of every window group."""
        bounds = list(self._bounds.values())
        sizes = [len(b) + 1 for b in bounds]
        offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        offset = {t: int(o) for t, o in zip(self._bounds, offsets.tolist(), strict=False)}
        total = max(int(offsets[-1]), 1)  # never empty: ``labels`` gathers index 0 as a dummy
        kind = np.full(total, _OPEN, dtype=np.int64)
        value = np.full(total, -1, dtype=np.int64)
        unstable = np.zeros(total, dtype=bool)
        if not bounds:
            every = np.ones(total, dtype=bool)
            return _Intervals(offset, kind, value, value.copy(), unstable, value.copy(), every)
        # interval k >= 1 of a thread starts at its boundary k - 1; interval 0 at "-infinity"
        lowest = np.array([np.iinfo(np.int64).min], dtype=np.int64)
        first = np.concatenate([x for b in bounds for x in (lowest, b)])
        owner = np.repeat(np.array(list(self._bounds), dtype=np.int64), sizes)
        done = np.zeros(total, dtype=bool)
        done[offsets[:-1]] = True  # interval 0: before every cutting range
        d_thread = np.concatenate([t[e <= s] for t, s, e in spans]).astype(np.int64)
        d_start = np.concatenate([s[e <= s] for _, s, e in spans]).astype(np.int64)
        for thread_id, b in self._bounds.items():
            mine = d_start[d_thread == thread_id]
            if len(mine):
                unstable[offset[thread_id] + np.searchsorted(b, mine, side="right")] = True
        return _Intervals(offset, kind, value, first, unstable, owner, done)

    def _resolve(self, interval: IntArray) -> None:
        """Look up the cutting state of the intervals ``interval`` asks about that are not
        known yet (one chain over them, in (thread, time) order: sorted keys)."""
        iv = self._intervals
        need = np.zeros(len(iv.done), dtype=bool)
        need[interval[interval >= 0]] = True
        need &= ~iv.done
        todo = np.flatnonzero(need)
        if len(todo) == 0:
            return
        kind, value = self._chain(iv.owner[todo], iv.first[todo], self._cutting)
        iv.kind[todo], iv.value[todo] = kind, value
        iv.done[todo] = True

    def split(
        self, thread: IntArray, lo: IntArray, cut: IntArray, hi: IntArray
    ) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Sub-pieces of ``[lo, hi)`` per query, cut where the thread's state changes strictly
        inside ``(lo, cut)``: (query index, start, end, elementary interval of the start for
        ``labels``; -1 on a thread without boundaries), zero-length pieces dropped."""
        n = len(lo)
        first = np.zeros(n, dtype=np.int64)  # in ``_flat_bounds``: the first boundary > lo
        count = np.zeros(n, dtype=np.int64)  # boundaries strictly inside (lo, cut)
        interval = np.full(n, -1, dtype=np.int64)
        for t, b in self._bounds.items():
            q = np.flatnonzero(thread == t)
            if len(q) == 0:
                continue
            a = np.searchsorted(b, lo[q], side="right")
            z = np.searchsorted(b, cut[q], side="left")
            first[q] = a + self._bound_offset[t]
            count[q] = np.maximum(z - a, 0)
            interval[q] = a + self._intervals.offset[t]
        # Pieces in (query, piece) order: each query's first piece at ``head``, then one piece
        # per inner boundary (``count``), filled only for the queries that have any.
        before = np.cumsum(count) - count
        head = np.arange(n, dtype=np.int64) + before
        total = n + int(before[-1] + count[-1]) if n else 0
        query = np.empty(total, dtype=np.int64)
        starts = np.empty(total, dtype=np.int64)
        where = np.empty(total, dtype=np.int64)
        query[head] = np.arange(n, dtype=np.int64)
        starts[head] = lo
        where[head] = interval
        multi = np.flatnonzero(count)
        if len(multi):
            c = count[multi]
            step = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c) + 1
            at = np.repeat(head[multi], c) + step
            query[at] = np.repeat(multi, c)
            starts[at] = self._flat_bounds[np.repeat(first[multi], c) + step - 1]
            where[at] = np.repeat(interval[multi], c) + step
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        ends[head + count] = hi
        keep = ends > starts
        if bool(keep.all()):
            return query, starts, ends, where
        return query[keep], starts[keep], ends[keep], where[keep]

    def _chain(
        self,
        thread: IntArray,
        time: IntArray,
        steps: list[tuple[RangeIndex, int, IntArray]],
        kind: IntArray | None = None,
        value: IntArray | None = None,
        open_: IntArray | None = None,
    ) -> tuple[IntArray, IntArray]:
        """Label the queries ``open_`` (all when None) by the first lookup of ``steps`` that
        finds a range; each lookup asks only about the queries the ones before it left open.
        Unlabelled queries keep their ``kind`` (``_OPEN`` when new)."""
        n = len(time)
        kind = np.full(n, _OPEN, dtype=np.int64) if kind is None else kind
        value = np.full(n, -1, dtype=np.int64) if value is None else value
        open_ = np.arange(n, dtype=np.int64) if open_ is None else open_
        for index, label_type, table in steps:
            if len(open_) == 0:
                break
            if len(index.rows) == 0:
                continue
            rows = index.lookup(thread[open_], time[open_])
            hit = rows >= 0
            kind[open_[hit]] = label_type
            value[open_[hit]] = table[rows[hit]]
            open_ = open_[~hit]
        return kind, value

    def labels(
        self, thread: IntArray, time: IntArray, interval: IntArray | None = None
    ) -> HostLabels:
        """The state of ``thread`` at ``time`` for each query. ``interval`` (from ``split``)
        gives each query's elementary interval, whose sync/helper state is known already
        (``_interval_states``); only what it leaves open is looked up."""
        n = len(time)
        if interval is None:
            kind, value = self._chain(thread, time, self._cutting + self._rest)
        else:
            self._resolve(interval)
            iv = self._intervals
            known = interval >= 0
            at = np.where(known, interval, 0)
            unsure = known & iv.unstable[at] & (time != iv.first[at])
            kind = np.where(known, iv.kind[at], _OPEN)
            value = np.where(known, iv.value[at], -1)
            redo = np.flatnonzero(unsure)
            kind[redo], value[redo] = _OPEN, -1
            self._chain(thread, time, self._cutting, kind, value, redo)
            self._chain(thread, time, self._rest, kind, value, np.flatnonzero(kind == _OPEN))
        kind[kind == _OPEN] = LabelType.UNANNOTATED
        detail = np.full(n, -1, dtype=np.int64)
        syncs = np.flatnonzero(kind == LabelType.SYNC)
        if len(syncs) and len(self._python.rows):
            detail[syncs] = self._names_of[self._python.lookup(thread[syncs], time[syncs])]
        return HostLabels(kind, value, detail)


_OPEN = -1
"""A query no lookup has labelled yet (``LabelType.UNANNOTATED`` in the end)."""


@dataclass(frozen=True, slots=True)
class _Intervals:
    """Per elementary interval of every thread (``HostStates._interval_states``), flat."""

    offset: dict[int, int]  # thread -> index of its interval 0
    kind: IntArray  # the cutting lookups' label type, ``_OPEN`` where none finds a range
    value: IntArray
    first: IntArray  # the interval's first instant (interval 0: the int64 minimum)
    unstable: BoolArray  # a degenerate range starts there (only ``first`` is known)
    owner: IntArray  # the interval's thread
    done: BoolArray  # ``kind`` and ``value`` known (``HostStates._resolve``)


__all__ = ["UNANNOTATED", "HostLabels", "HostStates", "LabelType"]
