"""Attribute every GPU activity to the catalogued helper that caused it.

Three joins, all vectorized (numpy sort + ``searchsorted``), no Python object per event:

1. **activity -> launch** by correlation id. nsys correlation ids are per process, so the key is
   ``(process, correlation)``; activities whose process key does not appear among the launches
   (Kineto writes the device as the kernel's pid) fall back to ``(rank, correlation)``. A CUDA
   graph launch is one launch row with many activities sharing its id: all of them join it.
   Duplicate launch rows with one key (some nsys versions write the runtime row twice) join the
   first, so nothing is double counted.
2. **launch -> innermost catalogued range** on the launching thread at launch time. Only ranges
   whose name the catalog recognises take part, so the innermost *catalogued* range wins even
   when uncatalogued frames sit in between. Backward kernels are launched from the autograd
   thread; that thread's own ranges (Python frames, NVTX pushed in backward) enclose them.
3. **range -> helper**, resolved once per distinct symbol id, never per event.

Precedence: a specific catalogued range (NVTX, ``record_function`` or Python frame) beats a
kernel-name pattern, which beats a *fallback* container range (``fallback = true`` in the
catalog, e.g. the whole TE CP forward). Kernel patterns with ``within`` apply only inside the
named container.

Example (one thread, catalog knows ``get_cu_seqlens_on_cp_rank`` and the container
``te_cp_forward``)::

    launches                          ranges (thread 7)
    row corr thread start              row name                       start  end
    0   11   7      105                0   ...AttnFuncWithCPAndKVP2P.forward 100  900
    1   12   7      205                1   ...get_cu_seqlens_on_cp_rank    200  300
    2   13   7      405                2   aten::copy_  (not catalogued)  400  450

    activities (before)                activities (after)
    row corr name                      helper                     matched_by launch
    0   12   triton_per_fused_..._0    get_cu_seqlens_on_cp_rank  range      1
    1   13   elementwise_kernel        te_cp_forward              range      2
    2   11   ncclDevKernel_SendRecv    cp_p2p_send_recv           kernel-name 0
    3   99   Memcpy DtoD               -1 (unattributed)          none       -1

Row 1 is inside the uncatalogued ``aten::copy_``; its innermost *catalogued* range is the
container. Row 2 is inside only the container, and a kernel pattern beats a container. Row 3 has
no launch with correlation 99, so only its name could match, and nothing does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from analyzers.catalog import Catalog
from analyzers.model import Trace
from analyzers.report import UNATTRIBUTED, Category

IntArray = npt.NDArray[np.int64]


class MatchedBy(IntEnum):
    """How an activity found its helper (values stored in ``Attribution.matched_by``)."""

    NONE = 0
    RANGE = 1
    PYTHON = 2
    KERNEL_NAME = 3


MATCHED_BY_LABELS = ("none", "range", "python", "kernel-name")


@dataclass(slots=True)
class Attribution:
    """Per-activity attribution, aligned with ``trace.activities`` row for row.

    ``helper`` indexes ``helper_names``/``categories`` (-1: unattributed); ``launch`` is the row
    of ``trace.launches`` (-1: no launch found); ``range_row`` is the row of ``trace.ranges``
    that claimed the activity (-1 when a kernel pattern or nothing did).
    """

    helper: npt.NDArray[np.int32]
    matched_by: npt.NDArray[np.int8]
    launch: IntArray
    range_row: IntArray
    helper_names: tuple[str, ...]
    categories: tuple[Category, ...]

    def name_of(self, helper_index: int) -> str:
        """Helper name for an index, ``UNATTRIBUTED`` for -1."""
        return UNATTRIBUTED if helper_index < 0 else self.helper_names[helper_index]

    def category_of(self, helper_index: int) -> Category:
        """Helper category for an index, ``Category.OTHER`` for -1."""
        return Category.OTHER if helper_index < 0 else self.categories[helper_index]


def _distinct(values: IntArray, limit: int = 64) -> IntArray:
    """Sorted distinct values; a few O(n) passes when there are few (processes, ranks, threads),
    a sort otherwise."""
    remaining, found = values, list[np.int64]()
    while len(remaining) and len(found) < limit:
        found.append(remaining[0])
        remaining = remaining[remaining != remaining[0]]
    if len(remaining):
        return np.unique(values)
    return np.sort(np.asarray(found, dtype=values.dtype))


def factorize(*columns: IntArray) -> list[IntArray]:
    """Map values of several columns onto one dense code space (0..distinct-1, sorted)."""
    uniques = np.unique(np.concatenate([_distinct(c) for c in columns]))
    return [np.searchsorted(uniques, col).astype(np.int64) for col in columns]


def _search(sorted_values: IntArray, keys: IntArray, side: str) -> IntArray:
    """``searchsorted`` that sorts the keys first: sorted keys walk the array cache-friendly."""
    if len(keys) < 2 or bool(np.all(keys[1:] >= keys[:-1])):
        return np.asarray(np.searchsorted(sorted_values, keys, side=side), dtype=np.int64)  # type: ignore[call-overload]
    order = np.argsort(keys, kind="stable")
    out = np.empty(len(keys), dtype=np.int64)
    out[order] = np.searchsorted(sorted_values, keys[order], side=side)  # type: ignore[call-overload]
    return out


_GROUP_LOOP_LIMIT = 64
"""Up to this many processes (or ranks) the join runs once per group with a boolean mask."""


def _join_in_group(
    a_rows: IntArray, a_corr: IntArray, l_rows: IntArray, l_corr: IntArray, result: IntArray
) -> None:
    """Write into ``result[a_rows]`` the first ``l_rows`` entry whose correlation matches.

    Within one process nsys appends runtime rows in correlation order, so ``l_corr`` is
    usually sorted already and no sort (and no sort-sized temporary) is needed; otherwise a
    stable argsort keeps the first of duplicate ids first. ``searchsorted`` then needs no
    table as large as the id range (ids count every API call, not only launches).
    """
    if not len(a_rows) or not len(l_rows):
        return
    if len(l_corr) > 1 and not bool(np.all(l_corr[1:] >= l_corr[:-1])):
        order = np.argsort(l_corr, kind="stable")
        l_rows, l_corr = l_rows[order], l_corr[order]
        del order
    pos = _search(l_corr, a_corr, "left")
    np.minimum(pos, len(l_corr) - 1, out=pos)
    hit = l_corr[pos] == a_corr
    result[a_rows[hit]] = l_rows[pos[hit]]


def _join_by_group(
    a_group: IntArray,
    a_corr: IntArray,
    a_mask: npt.NDArray[np.bool_],
    l_group: IntArray,
    l_corr: IntArray,
    result: IntArray,
) -> IntArray:
    """Join activities (where ``a_mask``) to launches on ``(group, correlation)``.

    One pass per distinct launch group (processes and ranks are few): only the rows of that
    group are copied out, so the temporaries are a fraction of the tables. Returns the
    distinct launch groups.
    """
    groups = _distinct(l_group, _GROUP_LOOP_LIMIT + 1)
    if len(groups) > _GROUP_LOOP_LIMIT:  # many processes (synthetic input): composite keys
        _join_composite(a_group, a_corr, a_mask, l_group, l_corr, result)
        return groups
    for group in groups:
        l_rows = np.flatnonzero(l_group == group)
        a_rows = np.flatnonzero((a_group == group) & a_mask)
        _join_in_group(a_rows, a_corr[a_rows], l_rows, l_corr[l_rows], result)
    return groups


def _join_composite(
    a_group: IntArray,
    a_corr: IntArray,
    a_mask: npt.NDArray[np.bool_],
    l_group: IntArray,
    l_corr: IntArray,
    result: IntArray,
) -> None:
    """The general join for many groups: rows sorted by group once, then joined per group."""
    a_code, l_code = factorize(a_group.astype(np.int64), l_group.astype(np.int64))
    codes = np.arange(int(max(a_code.max(), l_code.max())) + 2)
    l_order = np.lexsort((l_corr, l_code))  # by group, then id; ties keep row order
    l_bounds = np.searchsorted(l_code[l_order], codes)
    a_rows = np.flatnonzero(a_mask)
    a_rows = a_rows[np.argsort(a_code[a_rows], kind="stable")]
    a_bounds = np.searchsorted(a_code[a_rows], codes)
    del a_code, l_code
    for code in range(len(codes) - 1):
        l_rows = l_order[l_bounds[code] : l_bounds[code + 1]]
        a_part = a_rows[a_bounds[code] : a_bounds[code + 1]]
        _join_in_group(a_part, a_corr[a_part], l_rows, l_corr[l_rows], result)


def link_launches(trace: Trace) -> IntArray:
    """Row of ``trace.launches`` for each activity (-1 when none), by correlation id.

    Memory matters here (a multi-million-kernel export): columns are read as strided views
    of the structured arrays, and only one process's rows are copied out at a time.
    """
    acts, launches = trace.activities, trace.launches
    result = np.full(len(acts), -1, dtype=np.int64)
    if len(acts) == 0 or len(launches) == 0:
        return result
    a_corr, l_corr = acts["correlation"], launches["correlation"]
    a_process, l_process = acts["process"], launches["process"]
    has_corr = a_corr >= 0
    launch_processes = _join_by_group(a_process, a_corr, has_corr, l_process, l_corr, result)
    # Fallback for activities whose process key never launches anything (Kineto device pids).
    launching = np.isin(a_process, launch_processes)
    retry = has_corr & (result < 0) & ~launching & (acts["rank"] >= 0)
    del launching, has_corr
    if retry.any():
        # Launches of unknown rank (-1) never match: a retried activity has a rank >= 0.
        _join_by_group(acts["rank"], a_corr, retry, launches["rank"], l_corr, result)
    return result


_LOOKUP_SLICE = 1 << 18
"""Queries per slice of ``RangeIndex.lookup``: bounds its temporaries to a few MB."""


_BUILD_BLOCK = 1 << 17
"""Ranges per block of ``RangeIndex``'s build (whole threads; a larger thread is one block):
bounds its sort's temporaries to a few MB whatever the number of ranks."""


def thread_blocks(counts: IntArray, size: int) -> list[int]:
    """Ends (cumulative row counts) of consecutive groups of ``counts``, each group of at most
    ``size`` rows or one count alone."""
    ends: list[int] = []
    total = filled = 0
    for count in counts.tolist():
        if filled and filled + count > size:
            ends.append(total)
            filled = 0
        total += count
        filled += count
    if filled or not ends:
        ends.append(total)
    return ends


class RangeIndex:
    """Innermost-enclosing-range lookup over a subset of ranges, fully vectorized.

    Ranges are sorted per thread by (start, -end); nesting depth comes from counting starts and
    ends before each start, and each range's parent is the last earlier range one level up.
    A query ``(thread, t)`` takes the latest range starting at or before ``t`` on that thread and
    walks up the parent chain until a range contains ``t`` (in a nested forest, every range
    containing ``t`` is an ancestor of that latest range). Ranges are half-open ``[start, end)``.
    """

    def __init__(
        self,
        thread: IntArray,
        start: IntArray,
        end: IntArray,
        rows: IntArray,
        *,
        block: int = _BUILD_BLOCK,
    ) -> None:
        self.threads = np.unique(thread)
        self._base = int(start.min()) if len(start) else 0
        end = np.maximum(end, start + 1)
        t_idx = np.searchsorted(self.threads, thread)
        self._span = int(end.max() - self._base + 1) if len(end) else 1
        if len(self.threads) * self._span >= (1 << 62):
            raise OverflowError("time span too large for composite keys")
        n = len(rows)
        self.rows = np.empty(n, dtype=rows.dtype)
        self.key_start = np.empty(n, dtype=np.int64)
        self.key_end = np.empty(n, dtype=np.int64)
        self.thread_idx = np.empty(n, dtype=t_idx.dtype)
        self.parent = np.full(n, -1, dtype=np.int64)
        # Built in blocks of whole threads: a thread's keys lie in [t * span, (t + 1) * span),
        # so the sorted keys are the blocks' sorted keys one after the other, a range's depth
        # counts its own thread's ranges only and its parent is in its thread. The same arrays
        # as one pass over every range, with the sort's temporaries bounded by a block.
        by_thread = np.argsort(t_idx, kind="stable")  # each thread's rows in table order
        lo = 0
        for hi in thread_blocks(np.bincount(t_idx, minlength=len(self.threads)), block):
            self._build(by_thread[lo:hi], lo, t_idx, start, end, rows)
            lo = hi

    def _build(
        self,
        take: IntArray,
        lo: int,
        t_idx: IntArray,
        start: IntArray,
        end: IntArray,
        rows: IntArray,
    ) -> None:
        """Rows ``take`` (whole threads, in table order within each) sorted into positions
        ``lo:lo + len(take)``, with their depths' parents."""
        t = t_idx[take]
        key_start = t * self._span + (start[take] - self._base)
        key_end = t * self._span + (end[take] - self._base)
        order = np.lexsort((-key_end, key_start))
        here_rows = slice(lo, lo + len(take))
        self.rows[here_rows] = rows[take[order]]
        self.key_start[here_rows] = key_start = key_start[order]
        self.key_end[here_rows] = key_end[order]
        self.thread_idx[here_rows] = t[order]
        del t, order
        key_end.sort()
        depth = np.arange(len(take)) - np.searchsorted(key_end, key_start, side="right")
        del key_end, key_start
        parent = self.parent[here_rows]  # a view: written in place
        for level in range(1, int(depth.max()) + 1 if len(depth) else 0):
            upper = np.flatnonzero(depth == level - 1)
            here = np.flatnonzero(depth == level)
            if len(upper) == 0 or len(here) == 0:
                continue
            slot = np.searchsorted(upper, here, side="right") - 1
            parent[here] = np.where(slot >= 0, upper[np.maximum(slot, 0)] + lo, -1)

    def lookup(self, thread: IntArray, time: IntArray) -> IntArray:
        """Row (in the original range table) of the innermost range containing each query.

        Queries go in slices of ``_LOOKUP_SLICE``: the search needs several int64 temporaries
        per query, and a multi-million-kernel export would hold them all at once otherwise.
        """
        if len(thread) <= _LOOKUP_SLICE:
            return self._lookup(thread, time)
        out = np.empty(len(thread), dtype=np.int64)
        for lo in range(0, len(thread), _LOOKUP_SLICE):
            hi = lo + _LOOKUP_SLICE
            out[lo:hi] = self._lookup(thread[lo:hi], time[lo:hi])
        return out

    def _lookup(self, thread: IntArray, time: IntArray) -> IntArray:
        if len(self.rows) == 0 or len(thread) == 0:
            return np.full(len(thread), -1, dtype=np.int64)
        t_idx = np.searchsorted(self.threads, thread)  # few threads: cheap
        known = (t_idx < len(self.threads)) & (
            self.threads[np.minimum(t_idx, len(self.threads) - 1)] == thread
        )
        key = t_idx * self._span
        key += time
        key -= self._base
        cand = _search(self.key_start, key, "right")
        cand -= 1
        cand[~known] = -1
        del known
        ok = np.flatnonzero(cand >= 0)
        cand[ok[self.thread_idx[cand[ok]] != t_idx[ok]]] = -1
        del ok, t_idx
        active = np.flatnonzero(cand >= 0)
        while len(active):
            c = cand[active]
            outside = self.key_end[c] <= key[active]
            if not outside.any():
                break
            moving = active[outside]
            cand[moving] = self.parent[cand[moving]]
            active = moving[cand[moving] >= 0]
        del key, active
        hit = np.flatnonzero(cand >= 0)
        cand[hit] = self.rows[cand[hit]]
        return cand


def _query_order(thread: IntArray, time: IntArray) -> IntArray:
    """Permutation sorting queries by (thread, time); cheap when times are already sorted."""
    (codes,) = factorize(thread.astype(np.int64))
    if len(time) < 2 or bool(np.all(time[1:] >= time[:-1])):
        small = codes.astype(np.int16) if codes.max(initial=0) < 2**15 else codes
        return np.argsort(small, kind="stable")  # radix sort on small ints keeps time order
    return np.lexsort((time, codes))


def symbol_table(
    names: npt.NDArray[np.int32], size: int, match: Callable[[int], int]
) -> npt.NDArray[np.int32]:
    """Per-symbol lookup array: catalog match for every symbol id that occurs in ``names``."""
    table = np.full(size, -1, dtype=np.int32)
    if len(names):
        present = np.flatnonzero(np.bincount(names, minlength=size))
        for sym in present:
            table[sym] = match(int(sym))
    return table


def _range_index(trace: Trace, mask: npt.NDArray[np.bool_]) -> RangeIndex:
    rows = np.flatnonzero(mask).astype(np.int64)
    r = trace.ranges  # take three columns, not whole structured rows
    return RangeIndex(r["thread"][rows], r["start"][rows], r["end"][rows], rows)


@dataclass(slots=True)
class RangeHelpers:
    """Catalog matches of the trace's ranges and the lookup indexes built from them."""

    helper: npt.NDArray[np.int32]  # per range row: helper index or -1
    via_python: npt.NDArray[np.bool_]  # per range row: matched by a Python pattern
    specific: RangeIndex
    container: RangeIndex


def match_ranges(trace: Trace, catalog: Catalog) -> RangeHelpers:
    """Resolve every range name once and index the catalogued ranges per thread."""
    size = len(trace.strings)
    names = trace.ranges["name"]
    by_symbol = symbol_table(names, size, lambda s: catalog.match_range(trace.strings[s])[0])
    python_symbol = np.zeros(size, dtype=bool)
    for sym in np.flatnonzero(by_symbol >= 0):
        python_symbol[sym] = catalog.match_range(trace.strings[int(sym)])[1]
    helper = by_symbol[names] if len(names) else np.empty(0, dtype=np.int32)
    via_python = python_symbol[names] if len(names) else np.empty(0, dtype=bool)
    return index_ranges(trace, catalog, helper, via_python)


def index_ranges(
    trace: Trace,
    catalog: Catalog,
    helper: npt.NDArray[np.int32],
    via_python: npt.NDArray[np.bool_],
) -> RangeHelpers:
    """The lookup indexes over ranges whose catalog matches are known (``helper`` and
    ``via_python`` per row of ``trace.ranges``): ``match_ranges``' last step, and how the
    merge of per-rank parts indexes the matches each part made."""
    fallback = np.array([h.fallback for h in catalog.helpers] + [False], dtype=bool)
    is_fallback = fallback[helper]  # helper -1 indexes the trailing False
    return RangeHelpers(
        helper=helper,
        via_python=via_python,
        specific=_range_index(trace, (helper >= 0) & ~is_fallback),
        container=_range_index(trace, (helper >= 0) & is_fallback),
    )


def _within_mask(
    catalog: Catalog, kernel_helper: npt.NDArray[np.int32], container_helper: npt.NDArray[np.int32]
) -> npt.NDArray[np.bool_]:
    """False where a kernel pattern restricted by ``within`` fired outside its containers."""
    ok = np.ones(len(kernel_helper), dtype=bool)
    for index, helper in enumerate(catalog.helpers):
        if not helper.within:
            continue
        allowed = [catalog.index(name) for name in helper.within]
        here = kernel_helper == index
        ok[here] = np.isin(container_helper[here], allowed)
    return ok


def _spread(found: IntArray, rows: IntArray, launch: IntArray, n_launches: int) -> IntArray:
    """Per-activity range rows from per-launch answers (``found[i]`` for launch ``rows[i]``)."""
    by_launch = np.full(n_launches + 1, -1, dtype=np.int64)
    by_launch[rows] = found
    return by_launch[launch]  # launch -1 (none) reads the trailing -1


def attribute(trace: Trace, catalog: Catalog, ranges: RangeHelpers | None = None) -> Attribution:
    """Attribute each activity of ``trace`` to a catalog helper (see the module docstring)."""
    acts = trace.activities
    n = len(acts)
    ranges = ranges if ranges is not None else match_ranges(trace, catalog)
    launch = link_launches(trace)
    # Each launch row is looked up once, in (thread, time) order (cache-friendly searches),
    # and the answers are spread back to every activity of that launch (CUDA graphs).
    # Temporaries are freed as soon as used: this runs on multi-million-row tables.
    used = np.zeros(len(trace.launches) + 1, dtype=bool)
    used[launch] = True  # launch -1 marks the trailing slot, dropped below
    rows = np.flatnonzero(used[:-1])
    del used
    rows = rows[_query_order(trace.launches["thread"][rows], trace.launches["start"][rows])]
    thread, time = trace.launches["thread"][rows], trace.launches["start"][rows]
    n_launches = len(trace.launches)
    specific = _spread(ranges.specific.lookup(thread, time), rows, launch, n_launches)
    container = _spread(ranges.container.lookup(thread, time), rows, launch, n_launches)
    del thread, time, rows

    range_helper = np.append(ranges.helper, np.int32(-1))  # index -1 -> -1
    container_helper = range_helper[container]
    kernel_by_symbol = symbol_table(
        acts["name"], len(trace.strings), lambda s: catalog.match_kernel(trace.strings[s])
    )
    kernel_helper = kernel_by_symbol[acts["name"]] if n else np.empty(0, dtype=np.int32)
    # A restricted pattern (``within``) that fired outside its containers gives way to the
    # first unrestricted one: the library owning the kernel (NCCL, cuDNN, flash-attn), so a
    # TE/CP helper is only claimed where the trace shows TE/CP around the launch.
    outside = ~_within_mask(catalog, kernel_helper, container_helper)
    if outside.any():
        anywhere = symbol_table(
            acts["name"][outside],
            len(trace.strings),
            lambda s: catalog.match_kernel_anywhere(trace.strings[s]),
        )
        kernel_helper[outside] = anywhere[acts["name"][outside]]

    # Precedence, lowest first, each step overwriting: container, kernel name, specific range.
    helper = np.where(container >= 0, container_helper, np.int32(-1)).astype(np.int32)
    blocks = catalog.block_helpers()
    container_row = container.copy() if blocks else container[:0]
    del container_helper
    claimed_range = container
    use_kernel = kernel_helper >= 0
    helper[use_kernel] = kernel_helper[use_kernel]
    claimed_range[use_kernel] = -1
    del kernel_helper
    use_specific = specific >= 0
    helper[use_specific] = range_helper[specific[use_specific]]
    claimed_range[use_specific] = specific[use_specific]
    del specific, use_specific
    matched_by = np.full(n, MatchedBy.NONE, dtype=np.int8)
    by_range = claimed_range >= 0
    matched_by[by_range] = MatchedBy.RANGE
    range_python = np.append(ranges.via_python, False)
    matched_by[by_range & range_python[claimed_range]] = MatchedBy.PYTHON
    matched_by[use_kernel & ~by_range] = MatchedBy.KERNEL_NAME
    claimed_range = claimed_range.astype(np.int64, copy=False)
    for block in blocks:
        _claim_block(trace, catalog, block, launch, container_row, range_helper, helper)
    if blocks:
        # launches a block took from its container: matched by their kernel names' sequence
        taken = np.isin(helper, blocks) & (matched_by == MatchedBy.RANGE)
        taken &= ~np.isin(range_helper[claimed_range], blocks)
        matched_by[taken] = MatchedBy.KERNEL_NAME
        claimed_range[taken] = -1
    return Attribution(
        helper=helper,
        matched_by=matched_by,
        launch=launch,
        range_row=claimed_range,
        helper_names=tuple(h.name for h in catalog.helpers),
        categories=tuple(h.category for h in catalog.helpers),
    )


def _block_positions(
    group: IntArray, opens: npt.NDArray[np.bool_], closes: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Positions (rows sorted by group, then launch time) inside an opened and closed block.

    Position ``p`` is inside when, within its group, the latest opening at or before ``p``
    comes after the latest closing before ``p``, and the next closing at or after ``p`` comes
    before the next opening after ``p``: a block left open at the end of its group claims
    nothing.
    """
    n = len(group)
    pos = np.arange(n, dtype=np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = group[1:] != group[:-1]
    start = np.maximum.accumulate(np.where(new, pos, 0))
    last = np.append(np.flatnonzero(new)[1:], n) - 1  # group end per group, spread below
    end = last[np.cumsum(new) - 1]
    last_open = np.maximum.accumulate(np.where(opens, pos, -1))
    last_close = np.maximum.accumulate(np.where(closes, pos, -1))
    close_before = np.concatenate(([-1], last_close[:-1]))
    big = np.int64(n)
    next_close = np.minimum.accumulate(np.where(closes, pos, big)[::-1])[::-1]
    next_open = np.minimum.accumulate(np.where(opens, pos, big)[::-1])[::-1]
    open_after = np.append(next_open[1:], big)
    inside: npt.NDArray[np.bool_] = (
        (last_open >= start)
        & (last_open > close_before)
        & (next_close <= end)
        & (next_close < open_after)
    )
    return inside


def _claim_block(
    trace: Trace,
    catalog: Catalog,
    block: int,
    launch: IntArray,
    container_row: IntArray,
    range_helper: npt.NDArray[np.int32],
    helper: npt.NDArray[np.int32],
) -> None:
    """Give ``block`` the container-claimed launches of its blocks (``Helper.block_from``).

    Affects: ``helper`` in place, only rows whose helper is the container's.
    """
    allowed = [catalog.index(name) for name in catalog.helpers[block].within]
    container_helper = range_helper[container_row]
    rows = np.flatnonzero(np.isin(container_helper, allowed) & (launch >= 0))
    if len(rows) == 0:
        return
    names = trace.activities["name"][rows]
    size = len(trace.strings)
    edges = {s: catalog.block_edge(block, trace.strings[s]) for s in np.unique(names).tolist()}
    opening = symbol_table(names, size, lambda s: int(edges[s][0]))
    closing = symbol_table(names, size, lambda s: int(edges[s][1]))
    start = trace.launches["start"][launch[rows]]
    order = np.lexsort((start, container_row[rows]))
    rows, names = rows[order], names[order]
    inside = _block_positions(container_row[rows], opening[names] == 1, closing[names] == 1)
    take = rows[inside & (helper[rows] == container_helper[rows])]
    helper[take] = block


__all__ = [
    "MATCHED_BY_LABELS",
    "Attribution",
    "MatchedBy",
    "RangeHelpers",
    "RangeIndex",
    "attribute",
    "factorize",
    "link_launches",
    "match_ranges",
    "symbol_table",
]
