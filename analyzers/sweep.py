"""Exclusive shares of overlapping intervals, and how much of an interval a union covers.

Why not ``analyzers.intervals.interval_union``: that answers "how long is the union per
segment"; the account needs "which interval owns each instant" so the union can be split by
helper and collective with no remainder. The rule is *first come*: an instant belongs to the
interval that started earliest among those covering it (ties: input order). Sorted by start, an
interval owns ``[max(start, reach), end)`` where ``reach`` is the latest end of the intervals
before it in its segment; those pieces are disjoint and their lengths add up to the union
exactly (the tests check it against ``interval_union``).

All functions work on many segments (windows) at once with composite keys
``segment * width + (t - base)``; no Python loop over intervals. The GPU timeline's
decomposition (``analyzers.timeline``) takes its window unions here too, so its figures and
the account's parts come from the same definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Owned:
    """Per input interval (input order): the piece it owns, ``[piece_start, piece_end)``, empty
    (``piece_end == piece_start``) when earlier intervals cover it entirely."""

    piece_start: IntArray
    piece_end: IntArray
    order: IntArray | None
    """The input rows sorted by (segment, start): the pieces' order along each segment; None
    when the input was in that order already."""

    @property
    def length(self) -> IntArray:
        return self.piece_end - self.piece_start


def _running_max(seg: IntArray, values: IntArray) -> IntArray:
    """Running maximum of ``values`` restarting at every segment (rows sorted by segment)."""
    if len(values) == 0:
        return _EMPTY
    base = int(values.min())
    width = int(values.max()) - base + 1
    if (int(seg.max()) + 1) * width < (1 << 62):
        # segment s is lifted by s * width (minus the base): segments never mix, two passes
        # fewer than shifting by the base and lifting apart
        offset = seg * width
        offset -= base
        shifted = values + offset
        np.maximum.accumulate(shifted, out=shifted)
        shifted -= offset
        return shifted
    out = np.empty_like(values)
    for sid in np.unique(seg):
        rows = np.flatnonzero(seg == sid)
        out[rows] = np.maximum.accumulate(values[rows])
    return out


def owned(seg: IntArray, start: IntArray, end: IntArray, in_order: bool | None = None) -> Owned:
    """First-come exclusive pieces of ``[start, end)`` intervals within each segment.
    ``in_order``: whether the rows are ordered by (segment, start) already (checked if None)."""
    n = len(start)
    if n == 0:
        return Owned(_EMPTY, _EMPTY, None)
    end = np.maximum(end, start)
    if in_order is None:  # the usual input: clipped activities in window, time order
        in_order = _sorted(seg, start)
    if in_order:
        order = None
        s, e, g = start, end, seg
    else:
        order = np.lexsort((start, seg))
        s, e, g = start[order], end[order], seg[order]
    reach = _running_max(g, e)
    before = np.empty(n, dtype=np.int64)
    before[0] = s[0]
    before[1:] = reach[:-1]
    first = np.flatnonzero(g[1:] != g[:-1]) + 1
    before[first] = s[first]
    lo = np.maximum(s, before)
    hi = np.maximum(e, lo)
    if order is None:
        return Owned(lo, hi, None)
    piece_start = np.empty(n, dtype=np.int64)
    piece_end = np.empty(n, dtype=np.int64)
    piece_start[order] = lo
    piece_end[order] = hi
    return Owned(piece_start, piece_end, order)


def _sorted(seg: IntArray, start: IntArray) -> bool:
    """Whether rows are already ordered by (segment, start)."""
    if len(seg) < 2:
        return True
    step = seg[1:] - seg[:-1]
    return bool(np.all((step > 0) | ((step == 0) & (start[1:] >= start[:-1]))))


class Union:
    """The disjoint pieces of a union per segment, sorted by (segment, start)."""

    __slots__ = ("_search", "end", "first_row", "last_row", "seg", "start")

    def __init__(
        self,
        seg: IntArray,
        start: IntArray,
        end: IntArray,
        first_row: IntArray = _EMPTY,
        last_row: IntArray = _EMPTY,
    ) -> None:
        self.seg, self.start, self.end = seg, start, end
        self.first_row = first_row
        """Input row of the interval that opens each piece (the earliest-starting one); only
        when built ``with_rows``."""
        self.last_row = last_row
        """Input row of the interval whose end closes each piece; only ``with_rows``."""
        self._search: tuple[IntArray, IntArray, int, int, IntArray, IntArray] | None = None

    @classmethod
    def of(
        cls,
        seg: IntArray,
        start: IntArray,
        end: IntArray,
        with_rows: bool = False,
        in_order: bool | None = None,
    ) -> Union:
        """The union of the intervals; ``with_rows``: also the input rows opening and closing
        each piece; ``in_order`` as in ``owned``.

        Along (segment, start) order a row opens a piece when it starts after every earlier
        row of its segment has ended; the piece ends at the running maximum before the next
        opening row. Rows of zero length own nothing and are left out (one at the end of a
        piece must not join it to a piece starting there). The row closing a piece, the last
        whose ``owned`` piece is not empty, is the last row of the piece that raised the
        running maximum. The same pieces as merging the touching ``owned`` pieces (the tests
        check it), in about half the passes."""
        order: IntArray | None = None
        if not (in_order if in_order is not None else _sorted(seg, start)):
            order = np.lexsort((start, seg))
            seg, start, end = seg[order], start[order], end[order]
        rows: IntArray | None = None
        nonempty = end > start
        if not bool(nonempty.all()):
            rows = np.flatnonzero(nonempty)
            seg, start, end = seg[rows], start[rows], end[rows]
        n = len(start)
        if n == 0:
            return cls(_EMPTY, _EMPTY, _EMPTY)
        reach = _running_max(seg, end)
        opens = np.empty(n, dtype=bool)
        opens[0] = True
        np.not_equal(seg[1:], seg[:-1], out=opens[1:])
        opens[1:] |= start[1:] > reach[:-1]
        heads = np.flatnonzero(opens)
        tails = np.empty_like(heads)
        tails[:-1] = heads[1:] - 1
        tails[-1] = n - 1
        if not with_rows:
            return cls(seg[heads], start[heads], reach[tails])
        # rows that raise the running maximum: the opening ones, and those ending past it
        # (every piece has one: its opening row), counted up to each piece's last row
        raises = opens
        raises[1:] |= end[1:] > reach[:-1]
        raised = np.flatnonzero(raises)
        last = raised[np.cumsum(raises)[tails] - 1]
        first = heads
        for mapping in (rows, order):  # back to input rows: undo the filter, then the sort
            if mapping is not None:
                first, last = mapping[first], mapping[last]
        return cls(seg[heads], start[heads], reach[tails], first, last)

    def lengths(self, n: int) -> IntArray:
        """Union length per segment ``0..n-1``."""
        # float64 sums of integer ns are exact below 2**53 ns (104 days)
        total = np.bincount(self.seg, weights=self.end - self.start, minlength=n)
        return total.astype(np.int64)

    def covered(self, seg: IntArray, lo: IntArray, hi: IntArray) -> IntArray:
        """Length of ``[lo, hi)`` (per query, in segment ``seg``) that the union covers."""
        if len(lo) == 0 or len(self.start) == 0:
            return np.zeros(len(lo), dtype=np.int64)
        b_lo, b_hi = self.before_each(seg, lo, np.maximum(hi, lo))
        return b_hi - b_lo

    def before_each(self, seg: IntArray, first: IntArray, *later: IntArray) -> list[IntArray]:
        """Union length in segment ``seg`` (per query) before ``first`` and before each of
        ``later`` (times of the same queries, each at least ``first``: the end of an
        activity's piece, say).

        ``first`` takes one binary search over composite keys ``segment * width + (time -
        base)`` (the pieces are sorted by them; queries clamped to the union's time range,
        which changes no answer); the later times step on from where it landed: few pieces
        lie between two times of one activity, so a step or two, in memory the search has
        just read, replaces a search that misses the cache at most of its ~20 levels. Per
        segment when the keys would overflow.
        """
        times = (first, *later)
        if len(first) == 0 or len(self.start) == 0:
            return [np.zeros(len(first), dtype=np.int64) for _ in times]
        _, _, base, width, keys, _ = self._tables()
        if not len(keys) or (int(seg.max()) + 1) * width >= (1 << 62):
            return [self._before_per_segment(seg, t) for t in times]
        lift = seg * width
        lift -= base
        landed = _EMPTY  # where ``first`` landed: the later times step on from there
        out = []
        for t in times:
            q = np.clip(t, base, base + width - 1)
            q += lift
            if len(landed):
                k = _step(keys, landed, q)
            else:
                k = landed = np.searchsorted(keys, q, side="right") - 1
            out.append(self._before_at(k, q, lift))
        return out

    def _tables(self) -> tuple[IntArray, IntArray, int, int, IntArray, IntArray]:
        """Built once (the account asks each union up to three times): cumulative lengths,
        base, width, the pieces' composite keys and end keys (both empty when they would
        overflow), and per piece the union length of its segment before it minus its key
        (``_before_at`` then needs three gathers per query)."""
        if self._search is None:
            lengths = self.end - self.start
            cum = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=cum[1:])
            base = int(self.start.min())
            width = int(self.end.max()) - base + 1
            segs = int(self.seg.max()) + 2
            keys = end_keys = below = _EMPTY
            if (segs + 1) * width < (1 << 62):
                keys = self.seg * width
                keys += self.start - base
                end_keys = keys + lengths
                # cumulative length at each segment's first piece, subtracted per piece
                first = np.searchsorted(self.seg, np.arange(segs, dtype=np.int64), side="left")
                below = cum[:-1] - np.repeat(cum[first[:-1]], np.diff(first))  # seg is sorted
                below -= keys
            self._search = (cum, below, base, width, keys, end_keys)
        return self._search

    def _before_at(self, k: IntArray, q: IntArray, lift: IntArray) -> IntArray:
        """The union length before each composite query key ``q``, given ``k``, the last piece
        whose key is at most it: a piece of the query's own segment (its key is at least the
        segment's ``lift + base``) covers up to ``min(q, end key)``."""
        _, below, base, _, keys, end_keys = self._tables()
        kk = np.maximum(k, 0)
        key = keys[kk]
        inside = (k >= 0) & (key >= lift + base)
        return np.where(inside, below[kk] + np.minimum(q, end_keys[kk]), 0)

    def _before_per_segment(self, seg: IntArray, t: IntArray) -> IntArray:
        cum = self._tables()[0]
        lengths = self.end - self.start
        out = np.zeros(len(t), dtype=np.int64)
        for sid in np.unique(seg):
            q = np.flatnonzero(seg == sid)
            lo_i, hi_i = np.searchsorted(self.seg, [sid, sid + 1])
            if lo_i == hi_i:
                continue
            starts = self.start[lo_i:hi_i]
            k = np.searchsorted(starts, t[q], side="right") - 1
            inside = k >= 0
            kk = np.maximum(k, 0) + lo_i
            partial = np.minimum(np.maximum(t[q] - self.start[kk], 0), lengths[kk])
            out[q] = np.where(inside, cum[kk] - cum[lo_i] + partial, 0)
        return out

    def gaps(self, win_start: IntArray, win_end: IntArray) -> Gaps:
        """The complement of the union within each segment's ``[win_start, win_end)``
        (segment ``i`` is window ``i``), with the pieces before and after each gap."""
        n = len(win_start)
        if len(self.start) == 0:
            none = np.full(n, -1, dtype=np.int64)
            whole = Gaps(np.arange(n, dtype=np.int64), win_start, win_end, none, none)
            keep = whole.end > whole.start
            return Gaps(*(x[keep] for x in (whole.seg, whole.start, whole.end, none, none)))
        counts = np.bincount(self.seg, minlength=n)
        first = np.concatenate(([0], np.cumsum(counts)))[:-1]
        # Leading gap of each window: window start to its first piece (or the window end).
        has = counts > 0
        head = np.where(has, self.start[np.minimum(first, len(self.start) - 1)], win_end)
        lead = np.flatnonzero(win_start < head)  # empty ones dropped (gaps between never are)
        # Between consecutive pieces of one segment: never empty (touching pieces are one).
        same = np.flatnonzero(self.seg[1:] == self.seg[:-1])
        # Trailing gap: last piece to the window end.
        last = first + counts - 1
        tail = np.flatnonzero(has)
        tail = tail[self.end[last[tail]] < win_end[tail]]
        # Written in place, in this order (leading, between, trailing): the between part holds
        # nearly every gap, and gathering it straight into the result saves a copy of each
        # column.
        a, b = len(lead), len(lead) + len(same)
        out = Gaps(*(np.empty(b + len(tail), dtype=np.int64) for _ in range(5)))
        out.seg[:a], out.start[:a], out.end[:a] = lead, win_start[lead], head[lead]
        out.prev[:a], out.next[:a] = -1, np.where(has[lead], first[lead], -1)
        np.take(self.seg, same, out=out.seg[a:b])
        np.take(self.end, same, out=out.start[a:b])
        out.prev[a:b] = same
        np.add(same, 1, out=out.next[a:b])
        np.take(self.start, out.next[a:b], out=out.end[a:b])
        out.seg[b:], out.start[b:], out.end[b:] = tail, self.end[last[tail]], win_end[tail]
        out.prev[b:], out.next[b:] = last[tail], -1
        return out


_STEPS = 4
"""Steps ``_step`` takes one piece at a time before it searches for the queries still moving."""


def _step(keys: IntArray, k: IntArray, q: IntArray) -> IntArray:
    """The last index whose key is at most ``q``, per query, given ``k``: one at most ``q``
    already (or -1). Steps forward a piece at a time, then searches for the few left."""
    k = k.copy()
    last = len(keys) - 1
    todo = np.flatnonzero(k < last)
    for _ in range(_STEPS):
        if len(todo) == 0:
            return k
        todo = todo[keys[k[todo] + 1] <= q[todo]]
        k[todo] += 1
        todo = todo[k[todo] < last]
    if len(todo):
        k[todo] = np.searchsorted(keys, q[todo], side="right") - 1
    return k


@dataclass(frozen=True, slots=True)
class Gaps:
    """Idle intervals of a union within its windows; ``prev``/``next`` index the union's pieces
    (-1: the gap touches the window start or end)."""

    seg: IntArray
    start: IntArray
    end: IntArray
    prev: IntArray
    next: IntArray


__all__ = ["Gaps", "Owned", "Union", "owned"]
