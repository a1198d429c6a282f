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

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzers.attribution import RangeHelpers, RangeIndex, thread_blocks
from analyzers.model import RangeKind, Trace
from analyzers.syncs import HostSyncs

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


HOST_BLOCK = 1 << 18
"""Ranges per block of whole threads (a larger thread is a block alone) whose state lookups
are built at a time. Why: built over every range of a run at once they cost ~90 bytes a range
and were the largest part of the per-rank merge's memory, growing with the rank count; a
thread's state depends on its own ranges only, so each block's are built, asked and dropped
before the next."""

_OTHER, _PYTHON, _NEITHER = 0, 1, 2
"""Per range: in the index of other ranges, in the Python-frame index, or in neither (steps,
windows and catalogued ranges; a catalogued range is found by the helper lookups first)."""


def _in_block(values: IntArray, lo: int | None, hi: int | None) -> BoolArray:
    """``lo <= values < hi``, an absent bound open."""
    inside = np.ones(len(values), dtype=bool)
    if lo is not None:
        inside &= values >= lo
    if hi is not None:
        inside &= values < hi
    return inside


@dataclass(frozen=True, slots=True)
class _SyncCalls:
    """Host intervals of sync API calls and D2H copies (one per launch row that is one)."""

    index: RangeIndex  # its rows index the arrays below
    label: IntArray  # symbol naming the call
    thread: IntArray
    start: IntArray
    end: IntArray


def _sync_calls(trace: Trace, syncs: HostSyncs) -> _SyncCalls:
    """The blocking calls (``analyzers.syncs``) as host intervals of their threads."""
    launches = trace.launches
    thread = launches["thread"][syncs.calls].astype(np.int64)
    start = launches["start"][syncs.calls].astype(np.int64)
    index = RangeIndex(thread, start, syncs.end, np.arange(len(syncs.calls), dtype=np.int64))
    return _SyncCalls(index, syncs.label, thread, start, syncs.end)


_Lookup = tuple[RangeIndex, int, npt.NDArray[np.integer]]
"""A lookup of ``labels``' chain: the index, the label type it gives, the label value per row
of the index's table (only rows it finds are read)."""


class HostStates:
    """Lookups of every thread's state: the run-wide ones (sync calls, the catalog's range
    indexes) built once, the rest per block of threads (``HOST_BLOCK``) when asked."""

    def __init__(
        self,
        trace: Trace,
        ranges: RangeHelpers,
        window_names: set[str],
        syncs: HostSyncs,
        *,
        block: int = HOST_BLOCK,
    ) -> None:
        table = trace.ranges
        kind = np.ascontiguousarray(table["kind"])
        names = table["name"]
        window = np.zeros(len(trace.strings) + 1, dtype=bool)
        window[[s for n in window_names if (s := trace.strings.lookup(n)) is not None]] = True
        neither = (kind == RangeKind.STEP) | window[names]
        # Catalogued ranges are looked up first (``labels``): an instant the other index is
        # asked about lies in none of them, so leaving them out changes no answer.
        neither[ranges.specific.rows] = True
        neither[ranges.container.rows] = True
        self._class = np.where(
            kind == RangeKind.PYTHON, _PYTHON, np.where(neither, _NEITHER, _OTHER)
        ).astype(np.int8)
        del kind, neither
        self._table = table
        self._names = names
        self._calls = _sync_calls(trace, syncs)
        # The lookups whose ranges cut the pieces (``_boundaries``), in ``labels`` order.
        self._cutting: list[_Lookup] = [
            (syncs.op_ranges, LabelType.SYNC, names),
            (self._calls.index, LabelType.SYNC, self._calls.label),
            (ranges.specific, LabelType.HELPER, ranges.helper),
            (ranges.container, LabelType.HELPER, ranges.helper),
        ]
        self._edges = np.empty(0, dtype=np.int64)  # the first thread of each later block
        if len(table) > block:  # one block otherwise: no thread ids to sort
            threads, counts = np.unique(table["thread"], return_counts=True)
            ends = thread_blocks(counts, block)[:-1]  # in ranges: each block's last thread's end
            after = np.searchsorted(np.cumsum(counts), ends, side="right")
            self._edges = threads[after].astype(np.int64)

    def split_labels(
        self, thread: IntArray, lo: IntArray, cut: IntArray, hi: IntArray
    ) -> tuple[IntArray, IntArray, IntArray, HostLabels]:
        """``_BlockStates.split`` of every query, and the state at each piece's start
        (``labels``), block by block: (query index, start, end, labels), the pieces in
        (query, piece) order as one block of every thread gives them."""
        block = np.searchsorted(self._edges, thread, side="right")
        if len(block) == 0 or bool((block == block[0]).all()):
            return self._block(int(block[0]) if len(block) else 0).split_labels(thread, lo, cut, hi)
        order = np.argsort(block, kind="stable")
        cuts = np.flatnonzero(np.diff(block[order])) + 1
        found: list[tuple[IntArray, IntArray, IntArray, HostLabels]] = []
        for q in np.split(order, cuts):
            states = self._block(int(block[q[0]]))
            which, start, end, labels = states.split_labels(thread[q], lo[q], cut[q], hi[q])
            del states  # before the next block's are built
            found.append((q[which], start, end, labels))
        query = np.concatenate([f[0] for f in found])
        back = np.argsort(query, kind="stable")  # each query's pieces are in one block
        return (
            query[back],
            np.concatenate([f[1] for f in found])[back],
            np.concatenate([f[2] for f in found])[back],
            HostLabels(
                np.concatenate([f[3].type for f in found])[back],
                np.concatenate([f[3].value for f in found])[back],
                np.concatenate([f[3].detail for f in found])[back],
            ),
        )

    def _block(self, k: int) -> _BlockStates:
        """The lookups of the threads of block ``k`` (ids from its first thread up to the next
        block's first)."""
        lo = int(self._edges[k - 1]) if k > 0 else None
        hi = int(self._edges[k]) if k < len(self._edges) else None
        table = self._table
        if lo is None and hi is None:  # the one block of every thread: no row mask to build
            rows, cls = None, self._class
        else:
            rows = np.flatnonzero(_in_block(table["thread"], lo, hi))
            cls = self._class[rows]

        def index(which: int) -> RangeIndex:
            mine = np.flatnonzero(cls == which)
            if rows is not None:
                mine = rows[mine]
            mine = mine.astype(np.int64, copy=False)
            return RangeIndex(table["thread"][mine], table["start"][mine], table["end"][mine], mine)

        calls = self._calls
        spans = []
        for lookup, label_type, values in self._cutting:
            if lookup is calls.index:
                spans.append(_span(lookup, label_type, values, calls.start, calls.end, lo, hi))
            else:
                spans.append(
                    _span(lookup, label_type, values, table["start"], table["end"], lo, hi)
                )
        rest: list[_Lookup] = [
            (index(_OTHER), LabelType.RANGE, self._names),
            (index(_PYTHON), LabelType.RANGE, self._names),
        ]
        return _BlockStates(self._cutting, rest, spans, self._names)


class _BlockStates:
    """The state lookups of one block of threads (``HostStates``)."""

    def __init__(
        self,
        cutting: list[_Lookup],
        rest: list[_Lookup],
        spans: list[_Span],
        names: npt.NDArray[np.integer],
    ) -> None:
        self._cutting, self._rest = cutting, rest
        self._python = rest[1][0]
        self._names = names
        self._bounds, ranks = _boundaries(spans)
        self._intervals = _interval_states(self._bounds, spans, ranks)

    def split_labels(
        self, thread: IntArray, lo: IntArray, cut: IntArray, hi: IntArray
    ) -> tuple[IntArray, IntArray, IntArray, HostLabels]:
        which, start, end, interval = self.split(thread, lo, cut, hi)
        return which, start, end, self.labels(thread[which], start, interval)

    def split(
        self, thread: IntArray, lo: IntArray, cut: IntArray, hi: IntArray
    ) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Sub-pieces of ``[lo, hi)`` per query, cut where the thread's state changes strictly
        inside ``(lo, cut)``: (query index, start, end, elementary interval of the start for
        ``labels``), zero-length pieces dropped."""
        iv = self._intervals
        n = len(lo)
        lo = lo.astype(np.int64, copy=False)
        # (fresh full-size arrays cost page faults about as much as the work done in them:
        # few are made here, and the ones made are reused in place)
        interval = np.empty(n, dtype=np.int64)
        count = np.zeros(n, dtype=np.int64)  # boundaries strictly inside (lo, cut)
        seen = 0
        for t, b in self._bounds.items():
            q = np.flatnonzero(thread == t)
            if len(q) == 0:
                continue
            seen += len(q)
            a = np.searchsorted(b, lo[q], side="right")
            a += iv.offset[t]
            interval[q] = a
            # ``first[a + 1]`` is the first boundary after ``lo`` (or, past the thread's last
            # one, the next thread's "-infinity"): most queries have none before ``cut``, so
            # only the others are searched.
            a += 1
            maybe = np.flatnonzero(iv.first[a] < cut[q])
            if len(maybe):
                qm = q[maybe]
                z = np.searchsorted(b, cut[qm], side="left") + (iv.offset[t] + 1)
                count[qm] = np.maximum(z - a[maybe], 0)
        if seen < n:  # on a thread without boundaries: the interval standing for all its time
            interval[~np.isin(thread, np.array(list(self._bounds), dtype=np.int64))] = iv.dummy
        extra = int(count.sum())
        if extra == 0:
            query, starts, ends, where = (
                np.arange(n, dtype=np.int64),
                lo,
                hi.astype(np.int64, copy=False),
                interval,
            )
        else:
            # Pieces in (query, piece) order: piece j of a query starts at its ``lo`` (j = 0)
            # or at the first instant of elementary interval ``interval + j``.
            pieces = count
            pieces += 1
            query = np.repeat(np.arange(n, dtype=np.int64), pieces)
            head = np.cumsum(pieces)
            head -= pieces  # each query's first piece
            interval -= head  # piece at position p: interval ``interval[query] + p``
            where = interval[query]
            ends = np.arange(n + extra, dtype=np.int64)  # positions now, ends below
            where += ends
            starts = iv.first[where]
            starts[head] = lo
            ends[:-1] = starts[1:]
            head += pieces
            head -= 1  # each query's last piece
            ends[head] = hi
        keep = ends > starts
        if bool(keep.all()):
            return query, starts, ends, where
        return query[keep], starts[keep], ends[keep], where[keep]

    def _chain(
        self,
        thread: IntArray,
        time: IntArray,
        steps: list[_Lookup],
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
            iv = self._intervals
            if len(interval) and int(interval.min()) < 0:
                interval = np.where(interval >= 0, interval, iv.dummy)
            kind, value = iv.kind[interval], iv.value[interval]
            if iv.degenerate:
                redo = np.flatnonzero(iv.unstable[interval] & (time != iv.first[interval]))
                kind[redo], value[redo] = _OPEN, -1
                self._chain(thread, time, self._cutting, kind, value, redo)
            self._chain(thread, time, self._rest, kind, value, np.flatnonzero(kind == _OPEN))
        kind[kind == _OPEN] = LabelType.UNANNOTATED
        detail = np.full(n, -1, dtype=np.int64)
        syncs = np.flatnonzero(kind == LabelType.SYNC)
        if len(syncs) and len(self._python.rows):
            frame = self._python.lookup(thread[syncs], time[syncs])
            detail[syncs] = np.where(frame >= 0, self._names[np.maximum(frame, 0)], -1)
        return HostLabels(kind, value, detail)


@dataclass(frozen=True, slots=True)
class _Span:
    """A cutting lookup's ranges of one block of threads, in its index's order (by thread,
    then start): label values and times per position; positions count from the block's first."""

    label_type: int
    values: IntArray  # the label value per position
    start: IntArray
    end: IntArray  # as recorded: ``end <= start`` for a degenerate range
    parent: IntArray  # the enclosing range's position (the index's ``parent``), -1 none
    runs: list[tuple[int, int, int]]  # (thread id, first, last + 1 position) of each thread


def _span(
    index: RangeIndex,
    label_type: int,
    values: npt.NDArray[np.integer],
    start: npt.NDArray[np.integer],
    end: npt.NDArray[np.integer],
    lo: int | None,
    hi: int | None,
) -> _Span:
    """The ranges of ``index`` on threads ``lo <= id < hi``: a slice of its positions (they
    are in thread order), with ``values``, ``start`` and ``end`` read by its rows."""
    threads = index.threads
    t0 = int(np.searchsorted(threads, lo, side="left")) if lo is not None else 0
    t1 = int(np.searchsorted(threads, hi, side="left")) if hi is not None else len(threads)
    edges = np.searchsorted(index.thread_idx, np.arange(t0, t1 + 1)).tolist()
    p0, p1 = (edges[0], edges[-1]) if edges else (0, 0)
    rows = index.rows[p0:p1]
    parent = index.parent[p0:p1]
    parent = np.where(parent >= 0, parent - p0, -1)  # a parent is on its range's thread
    runs = [
        (t, g0 - p0, g1 - p0)
        for t, g0, g1 in zip(threads[t0:t1].tolist(), edges[:-1], edges[1:], strict=True)
        if g1 > g0
    ]
    return _Span(
        label_type,
        values[rows].astype(np.int64, copy=False),
        start[rows].astype(np.int64, copy=False),
        end[rows].astype(np.int64, copy=False),
        parent,
        runs,
    )


_OPEN = -1
"""A query no lookup has labelled yet (``LabelType.UNANNOTATED`` in the end)."""

_Ranks = list[tuple[IntArray, IntArray]]
"""Per span of a block (``_span``): where each range's start and end lie in its thread's
boundaries (index into ``_boundaries``' array of that thread), in the span's order."""


def _boundaries(spans: list[_Span]) -> tuple[dict[int, IntArray], _Ranks]:
    """Per thread (ascending ids), the sorted distinct instants where its state can change:
    the starts and ends of ``spans``, and where each of them lies among them. Only helper and
    sync ranges cut: a stretch outside every helper is labelled by the innermost other range
    (or Python frame) open at its start."""
    runs: dict[int, list[tuple[int, int, int]]] = {}  # thread -> (span, first, last + 1)
    for i, span in enumerate(spans):
        for t, g0, g1 in span.runs:
            runs.setdefault(t, []).append((i, g0, g1))
    ranks = [(np.empty(len(s.start), np.int64), np.empty(len(s.start), np.int64)) for s in spans]
    out: dict[int, IntArray] = {}
    for t in sorted(runs):
        parts = [x for i, g0, g1 in runs[t] for x in (spans[i].start[g0:g1], spans[i].end[g0:g1])]
        times = np.concatenate(parts).astype(np.int64, copy=False)
        # a few sorted runs (each index's starts, nearly its ends): the stable sort merges them,
        # and its order tells where each start and end went (no search afterwards)
        order = np.argsort(times, kind="stable")
        times = times[order]
        new = np.empty(len(times), dtype=bool)
        new[0] = True
        np.not_equal(times[1:], times[:-1], out=new[1:])
        out[t] = times[new]
        rank = np.empty(len(times), dtype=np.int64)
        rank[order] = np.cumsum(new) - 1
        at = 0
        for i, g0, g1 in runs[t]:
            n = g1 - g0
            ranks[i][0][g0:g1] = rank[at : at + n]
            ranks[i][1][g0:g1] = rank[at + n : at + 2 * n]
            at += 2 * n
    return out, ranks


def _interval_states(bounds: dict[int, IntArray], spans: list[_Span], ranks: _Ranks) -> _Intervals:
    """The cutting lookups' answer on every elementary interval of every thread.

    Thread ``t`` with boundaries ``b`` (``_boundaries``) has intervals ``k = 0..len(b)``,
    ``[b[k-1], b[k])``: no sync or helper range opens or closes strictly inside one, so the
    cutting lookups (``_cutting``) answer the same for every instant of it, except in an
    interval starting where a degenerate range (``end <= start``, which ``RangeIndex`` treats
    as ``[start, start + 1)``) starts: there only its first instant is known. Interval 0 lies
    before every cutting range; one more interval at the end stands for every instant of a
    thread without boundaries. Each lookup is answered at every interval's first instant by
    ``_first_instant_lookup``, in ``labels`` order: an interval a lookup labels is not asked
    of the next ones."""
    sizes = [len(b) + 1 for b in bounds.values()]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64).tolist()
    offset = dict(zip(bounds, offsets, strict=False))
    total = offsets[-1] + 1
    kind = np.full(total, _OPEN, dtype=np.int64)
    value = np.full(total, -1, dtype=np.int64)
    unstable = np.zeros(total, dtype=bool)
    # interval k >= 1 of a thread starts at its boundary k - 1; interval 0 at "-infinity"
    lowest = np.array([np.iinfo(np.int64).min], dtype=np.int64)
    first = np.concatenate([*(x for b in bounds.values() for x in (lowest, b)), lowest])
    degenerate = False
    for span, (start_at, end_at) in zip(spans, ranks, strict=True):
        if len(span.start) == 0:
            continue
        # per range: the intervals whose first instant it holds, from the one its start opens
        # to the one before its end (a degenerate range: only the first)
        lo = start_at + 1
        flat = span.end <= span.start
        hi = np.where(flat, lo, end_at) if flat.any() else end_at
        values = span.values
        for t, g0, g1 in span.runs:
            at, size = offset[t], len(bounds[t]) + 1
            here = slice(at, at + size)
            k, pos = _first_instant_lookup(lo, hi, span.parent, g0, g1, kind[here] == _OPEN)
            kind[here][k] = span.label_type
            value[here][k] = values[pos]
            if hi is not end_at:
                degenerate = True
                unstable[here][lo[g0:g1][flat[g0:g1]]] = True
    return _Intervals(offset, kind, value, first, unstable, offsets[-1], degenerate)


def _first_instant_lookup(
    lo: IntArray, hi: IntArray, parent: IntArray, g0: int, g1: int, asked: BoolArray
) -> tuple[IntArray, IntArray]:
    """``RangeIndex.lookup`` of one thread's ranges at the first instant of each elementary
    interval ``k`` of that thread that ``asked`` marks (as in ``_interval_states``): the
    intervals where it finds a range, and that range's position in the index's order. Per
    position of the index: ``lo..hi``, the intervals whose first instant the range holds,
    and its ``parent``; the thread's ranges are positions ``g0..g1 - 1``.

    The lookup takes the last range (in index order: by start, then longest first) starting
    at or before the instant and walks up its parents until one holds the instant. The same
    walk here, nested ranges or not, but the last range with ``lo <= k`` is a running count,
    not a search, and an interval that no range holds (as many ranges end before it as start
    by it) needs no walk."""
    size = len(asked)
    started = np.cumsum(np.bincount(lo[g0:g1], minlength=size + 1)[:size])  # lo <= k
    ended = np.cumsum(np.bincount(hi[g0:g1] + 1, minlength=size + 1)[:size])  # hi < k
    held = started > ended
    held &= asked
    k = np.flatnonzero(held)
    pos = started[k]
    pos += g0 - 1
    walk = np.flatnonzero(hi[pos] < k)
    while len(walk):
        pos[walk] = parent[pos[walk]]
        walk = walk[pos[walk] >= 0]
        walk = walk[hi[pos[walk]] < k[walk]]
    hit = pos >= 0
    return k[hit], pos[hit]


@dataclass(frozen=True, slots=True)
class _Intervals:
    """Per elementary interval of every thread (``_interval_states``), flat."""

    offset: dict[int, int]  # thread -> index of its interval 0
    kind: IntArray  # the cutting lookups' label type, ``_OPEN`` where none finds a range
    value: IntArray
    first: IntArray  # the interval's first instant (interval 0: the int64 minimum)
    unstable: BoolArray  # a degenerate range starts there (only ``first`` is known)
    dummy: int  # the interval of every instant of a thread without boundaries (the last)
    degenerate: bool  # any interval is unstable


__all__ = ["UNANNOTATED", "HostLabels", "HostStates", "LabelType"]
