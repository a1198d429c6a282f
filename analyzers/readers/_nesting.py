"""Nesting of annotation ranges per thread, computed with sorts instead of a Python stack.

Ranges nest within a *family* on a thread: ranges written by one tracer (Kineto's Python tracer,
its RecordFunction ops and annotations, an NVTX push/pop stack). Different tracers do not nest
into each other: ``record_function("x")`` opens inside the Python frame of ``__enter__`` and
closes inside ``__exit__``, so its range straddles Python frames. Each family gets its own
parent/depth tree; callers that need "innermost range of any kind at time t" search by time.

A Python stack pass costs about a microsecond per range; an nsys export of a long run has
millions of NVTX rows, so the readers use this vectorized form instead.

For ranges on one thread sorted by (start ascending, end descending):

* ``depth[k]`` is the number of ranges still open when ``k`` starts: ranges that started
  before ``k`` (its position in the thread's order) minus those that already ended
  (``end <= start[k]``; back-to-back ranges do not nest).
* ``parent[k]`` is the latest range before ``k`` on the thread with depth ``depth[k] - 1``,
  kept only when it is still open at ``start[k]`` (badly nested input gets -1, never a
  range that does not enclose the child's start).

Example (one thread, times in ns)::

    row  start  end   ->  depth  parent
    0      0    100        0      -1
    1     10     50        1       0
    2     20     30        2       1
    3     60     90        1       0
    4    100    120        0      -1   (starts as row 0 ends: a sibling, not a child)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


def nest(
    thread: I64, start: I64, end: I64, family: npt.NDArray[np.integer] | None = None
) -> tuple[I64, npt.NDArray[np.int16]]:
    """Return ``(parent, depth)`` in input row order; ``parent`` holds input row indices.

    ``family`` (optional, one small int per row) splits a thread's ranges into trees that are
    nested independently; without it all ranges of a thread form one family.
    """
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    depth_out = np.zeros(n, dtype=np.int16)
    if n == 0:
        return parent, depth_out
    # Temporaries are dropped as soon as they are used: on a long trace they, not the
    # output, set the reader's peak memory.
    group = _group_ids(thread, family)
    order = _sorted_order(group, start, end)
    g = group[order]
    del group
    boundary = np.empty(n, dtype=bool)
    boundary[0] = True
    np.not_equal(g[1:], g[:-1], out=boundary[1:])
    del g
    seg = np.cumsum(boundary, dtype=np.int64)
    seg -= 1
    seg_start = np.flatnonzero(boundary)[seg]
    del boundary
    s, e = start[order], end[order]
    depth = _open_count(seg, seg_start, s, e)
    del seg_start
    sorted_parent = _parent_at_depth(seg, depth, s, e)
    del seg, s, e
    depth_out[order] = np.minimum(depth, np.iinfo(np.int16).max).astype(np.int16)
    del depth
    has_parent = sorted_parent >= 0
    parent[order[has_parent]] = order[sorted_parent[has_parent]]
    return parent, depth_out


def _group_ids(thread: I64, family: npt.NDArray[np.integer] | None) -> I64:
    """One small int per (thread, family) pair, ordered like the pairs."""
    group = _dense_ids(thread)
    if family is not None:
        fam = _dense_ids(family)
        group *= int(fam.max()) + 1
        group += fam
    return group


_FEW = 64
"""Up to this many distinct values, a masked pass per value beats sorting the rows."""


def _dense_ids(values: npt.NDArray[np.integer]) -> I64:
    """``np.unique(values, return_inverse=True)[1]`` as int64, in linear time while the
    values are few (threads and families are: a handful per process, millions of ranges)."""
    found: list[int] = []
    remaining = values
    while len(remaining) and len(found) <= _FEW:
        found.append(int(remaining[0]))
        remaining = remaining[remaining != remaining[0]]
    if len(remaining):  # many distinct values: sort them
        _, inverse = np.unique(values, return_inverse=True)
        ids: I64 = inverse.reshape(-1).astype(np.int64)
        return ids
    distinct = np.sort(np.asarray(found, dtype=values.dtype))
    ids = np.searchsorted(distinct, values).astype(np.int64)
    return ids


def _sorted_order(group: I64, start: I64, end: I64) -> npt.NDArray[np.intp]:
    """``np.lexsort((-end, start, group))``, without the sort by time when rows already come
    in that order within each group.

    An nsys export and a Kineto trace write ranges in start order per thread, so a stable sort
    by the small group id alone (a radix sort on int16) gives the lexsort's exact order: the
    check below (start ascending, end descending on equal starts, within each group) proves
    that it does, and any row out of order falls back to the full sort.
    """
    if len(group) > 1 and int(group.max()) < 2**15:
        order = np.argsort(group.astype(np.int16), kind="stable")
        g, s = group[order], start[order]
        same_group = g[1:] == g[:-1]
        step = s[1:] - s[:-1]
        in_order = not bool((same_group & (step < 0)).any())
        if in_order:
            tied = same_group & (step == 0)
            if tied.any():
                e = end[order]
                in_order = not bool((tied & (e[1:] > e[:-1])).any())
        if in_order:
            return order
    return np.lexsort((-end, start, group))


def _open_count(seg: I64, seg_start: I64, s: I64, e: I64) -> I64:
    """Ranges open at each start: position in the thread minus ranges already ended."""
    n = len(s)
    low = min(int(s.min()), int(e.min()))
    width = max(int(s.max()), int(e.max())) - low + 1
    if width * (int(seg[-1]) + 1) < 2**62:
        # (segment, time) as one int64 key: segment * width + time offset.
        keys = seg * np.int64(width)
        keys -= np.int64(low)
        end_keys = keys + e
        end_keys.sort()
        keys += s
        ended = np.searchsorted(end_keys, keys, side="right")
        del keys, end_keys
    else:
        # Epoch-ns timestamps over many threads: dense time ranks keep the key in int64.
        times, inverse = np.unique(np.concatenate((s, e)), return_inverse=True)
        rank_width = np.int64(len(times) + 1)
        del times
        inverse = inverse.reshape(-1).astype(np.int64)
        base = seg * rank_width
        end_keys = np.sort(base + inverse[n:])
        base += inverse[:n]
        del inverse
        ended = np.searchsorted(end_keys, base, side="right")
        del base, end_keys
    ended -= seg_start
    open_count: I64 = np.arange(n, dtype=np.int64)
    open_count -= seg_start
    open_count -= ended
    del ended
    np.maximum(open_count, 0, out=open_count)
    return open_count


def _parent_at_depth(seg: I64, depth: I64, s: I64, e: I64) -> I64:
    """Sorted position of the latest earlier range one level up, or -1."""
    n = len(s)
    levels = np.int64(int(depth.max()) + 1)
    # (segment, depth) group per row; rows ordered by (group, position) = a stable sort.
    key = seg * levels
    key += depth
    by_group = np.argsort(key, kind="stable")
    sorted_keys = key[by_group]
    sorted_keys *= n
    sorted_keys += by_group  # (group, position) as one key, ascending
    key -= 1
    key *= n
    key += np.arange(n, dtype=np.int64)  # wanted: (group one level up, this position)
    hit = np.searchsorted(sorted_keys, key, side="left")
    hit -= 1  # the latest row before this position in the wanted group, if it is that group
    ok = depth > 0
    ok &= hit >= 0
    np.maximum(hit, 0, out=hit)
    sorted_keys //= n
    key //= n
    ok &= sorted_keys[hit] == key
    del sorted_keys, key
    found: I64 = by_group[hit]
    del by_group, hit
    ok &= e[found] >= s  # a parent must still be open when the child starts
    found[~ok] = -1
    return found
