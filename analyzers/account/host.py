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

from analyzers.attribution import Attribution, RangeHelpers, RangeIndex, factorize
from analyzers.catalog import Catalog
from analyzers.model import ActivityKind, RangeKind, Trace

IntArray = npt.NDArray[np.int64]

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


def _index(trace: Trace, rows: IntArray) -> RangeIndex:
    r = trace.ranges
    return RangeIndex(r["thread"][rows], r["start"][rows], r["end"][rows], rows)


@dataclass(frozen=True, slots=True)
class _SyncCalls:
    """Host intervals of sync API calls and D2H copies (rows of ``trace.launches``)."""

    index: RangeIndex
    label: IntArray  # per launch row: symbol naming the call (-1: not a sync call)
    thread: IntArray
    start: IntArray
    end: IntArray


def _sync_calls(trace: Trace, catalog: Catalog, att: Attribution) -> _SyncCalls:
    """Sync API launch rows and D2H copy launches as host intervals, with their labels."""
    launches, acts = trace.launches, trace.activities
    label = np.full(len(launches), -1, dtype=np.int64)
    ends = launches["end"].astype(np.int64).copy()
    apis = [s for s in np.unique(launches["api"]) if catalog.is_sync("apis", trace.strings[int(s)])]
    api_rows = np.flatnonzero(np.isin(launches["api"], apis))
    label[api_rows] = launches["api"][api_rows]
    copies = np.flatnonzero(acts["kind"] == ActivityKind.MEMCPY)
    if len(copies):
        names = [
            s
            for s in np.unique(acts["name"][copies])
            if catalog.is_sync("memcpy", trace.strings[int(s)])
        ]
        d2h = copies[np.isin(acts["name"][copies], names) & (att.launch[copies] >= 0)]
        rows = att.launch[d2h]
        label[rows] = acts["name"][d2h]
        np.maximum.at(ends, rows, acts["end"][d2h].astype(np.int64))
    rows = np.flatnonzero(label >= 0).astype(np.int64)
    thread = launches["thread"][rows].astype(np.int64)
    start = launches["start"][rows].astype(np.int64)
    return _SyncCalls(RangeIndex(thread, start, ends[rows], rows), label, thread, start, ends[rows])


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
        sync_symbols = [
            s for s in np.unique(names).tolist() if catalog.is_sync("ops", trace.strings[s])
        ]
        window_symbols = [s for n in window_names if (s := trace.strings.lookup(n)) is not None]
        sync_op_rows = np.flatnonzero(np.isin(names, sync_symbols) & (kind == RangeKind.CPU_OP))
        other = (kind != RangeKind.PYTHON) & (kind != RangeKind.STEP)
        other &= ~np.isin(names, window_symbols)
        # Catalogued ranges are looked up first (``labels``): an instant the other index is
        # asked about lies in none of them, so leaving them out changes no answer.
        other[ranges.specific.rows] = False
        other[ranges.container.rows] = False
        self._sync_ops = _index(trace, sync_op_rows.astype(np.int64))
        self._calls = _sync_calls(trace, catalog, att)
        self._any = _index(trace, np.flatnonzero(other).astype(np.int64))
        self._python = _index(trace, np.flatnonzero(kind == RangeKind.PYTHON).astype(np.int64))
        self._bounds = self._boundaries()

    def _boundaries(self) -> dict[int, IntArray]:
        """Per thread, the sorted instants where its state can change."""
        table = self._trace.ranges
        threads, times = (
            [self._calls.thread, self._calls.thread],
            [self._calls.start, self._calls.end],
        )
        # Only helper and sync ranges cut: a stretch outside every helper is labelled by the
        # innermost other range (or Python frame) open at its start.
        for index in (self._sync_ops, self._ranges.specific, self._ranges.container):
            rows = index.rows
            threads += [table["thread"][rows], table["thread"][rows]]
            times += [table["start"][rows], table["end"][rows]]
        thread = np.concatenate(threads).astype(np.int64)
        time = np.concatenate(times).astype(np.int64)
        if len(thread) == 0:
            return {}
        # Sorted distinct (thread, time) pairs: one sort of int64 keys (thread code, time)
        # when they fit, else a two-key sort.
        (code,) = factorize(thread)
        base = int(time.min())
        width = int(time.max()) - base + 1
        if (int(code.max()) + 1) * width < (1 << 62):
            key = np.sort(code * width + (time - base))  # a sort: numpy's unique hashes
            key = key[np.concatenate(([True], key[1:] != key[:-1]))]
            distinct = np.zeros(int(code.max()) + 1, dtype=np.int64)
            distinct[code] = thread
            thread, time = distinct[key // width], key % width + base
        else:
            order = np.lexsort((time, thread))
            thread, time = thread[order], time[order]
            keep = np.ones(len(time), dtype=bool)
            keep[1:] = (thread[1:] != thread[:-1]) | (time[1:] != time[:-1])
            thread, time = thread[keep], time[keep]
        cuts = np.flatnonzero(np.diff(thread)) + 1
        return {
            int(t[0]): v for t, v in zip(np.split(thread, cuts), np.split(time, cuts), strict=True)
        }

    def split(
        self, thread: IntArray, lo: IntArray, cut: IntArray, hi: IntArray
    ) -> tuple[IntArray, IntArray, IntArray]:
        """Sub-pieces of ``[lo, hi)`` per query, cut where the thread's state changes strictly
        inside ``(lo, cut)``: (query index, start, end), zero-length pieces dropped."""
        n = len(lo)
        first = np.zeros(n, dtype=np.int64)
        count = np.zeros(n, dtype=np.int64)
        bounds: list[IntArray] = []
        offset = 0
        for t in np.unique(thread).tolist():
            b = self._bounds.get(int(t))
            if b is None or len(b) == 0:
                continue
            q = np.flatnonzero(thread == t)
            a = np.searchsorted(b, lo[q], side="right")
            z = np.searchsorted(b, cut[q], side="left")
            first[q] = a + offset
            count[q] = np.maximum(z - a, 0)
            bounds.append(b)
            offset += len(b)
        flat = np.concatenate(bounds) if bounds else np.empty(0, dtype=np.int64)
        per = count + 1
        query = np.repeat(np.arange(n, dtype=np.int64), per)
        pos = np.arange(len(query), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
        starts = lo[query].copy()
        inner = pos > 0
        starts[inner] = flat[first[query[inner]] + pos[inner] - 1]
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        last = np.cumsum(per) - 1
        ends[last] = hi
        keep = ends > starts
        return query[keep], starts[keep], ends[keep]

    def labels(self, thread: IntArray, time: IntArray) -> HostLabels:
        """The state of ``thread`` at ``time`` for each query; each lookup asks only about the
        queries the ones before it left open."""
        n = len(time)
        names = np.append(self._trace.ranges["name"].astype(np.int64), -1)
        helper = np.append(self._ranges.helper.astype(np.int64), -1)
        kind = np.full(n, LabelType.UNANNOTATED, dtype=np.int64)
        value = np.full(n, -1, dtype=np.int64)
        detail = np.full(n, -1, dtype=np.int64)
        open_ = np.arange(n, dtype=np.int64)
        sync_label = np.append(self._calls.label, -1)
        steps: list[tuple[RangeIndex, int, IntArray]] = [
            (self._sync_ops, LabelType.SYNC, names),
            (self._calls.index, LabelType.SYNC, sync_label),
            (self._ranges.specific, LabelType.HELPER, helper),
            (self._ranges.container, LabelType.HELPER, helper),
            (self._any, LabelType.RANGE, names),
            (self._python, LabelType.RANGE, names),
        ]
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
        syncs = np.flatnonzero(kind == LabelType.SYNC)
        if len(syncs) and len(self._python.rows):
            detail[syncs] = names[self._python.lookup(thread[syncs], time[syncs])]
        return HostLabels(kind, value, detail)


__all__ = ["UNANNOTATED", "HostLabels", "HostStates", "LabelType"]
