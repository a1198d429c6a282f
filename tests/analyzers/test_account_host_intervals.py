"""The host states' per-interval shortcut (``_interval_states``) against the generic lookups,
and the states built per block of threads against one block of every thread.

``HostStates`` answers the sync/helper lookups once per elementary interval between two cutting
boundaries of a thread, in interval numbers instead of ``RangeIndex.lookup``. The answer must
be ``RangeIndex.lookup``'s, also where it is not the innermost range (partly overlapping
ranges), for degenerate ranges (``end <= start``) and on threads without cutting ranges:
random hand-made traces with all of these, queried at every boundary and at random instants.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analyzers.account.host import (
    _OPEN,
    HostStates,
    LabelType,
    _BlockStates,
    _boundaries,
    _interval_states,
    _span,
)
from analyzers.attribution import RangeIndex, attribute, match_ranges
from analyzers.catalog import load_catalog
from analyzers.model import ActivityKind, RangeKind
from analyzers.syncs import host_syncs
from tests.analyzers.factories import TraceBuilder

SPECIFIC = ("cp_attention.partition", "cp_attention.metadata")
CONTAINER = "transformer_engine.AttnFuncWithCP.forward"
SYNC_OP = "aten::item"


def _random_ranges(rng: np.random.Generator, n: int, horizon: int) -> list[tuple[int, int]]:
    """Nested, partly overlapping, equal and degenerate (``end <= start``) ranges."""
    out: list[tuple[int, int]] = []
    for _ in range(n):
        start = int(rng.integers(0, horizon))
        shape = rng.integers(0, 10)
        if shape == 0:
            end = start - int(rng.integers(0, 3))  # degenerate: end == start or before it
        elif shape == 1 and out:
            start, end = out[int(rng.integers(0, len(out)))]  # an exact duplicate
        else:
            end = start + int(rng.integers(1, horizon // 4))
        out.append((start, end))
    return out


def _states(seed: int, block: int = 1 << 20) -> HostStates:
    """Threads 1 and 2: every kind of cutting range; thread 3: only other ranges and Python
    frames (no boundaries); thread 4: nothing at all (asked about anyway)."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder()
    for thread in (1, 2):
        for start, end in _random_ranges(rng, 25, 400):
            b.range(SPECIFIC[int(rng.integers(0, 2))], start, end, thread=thread)
        for start, end in _random_ranges(rng, 6, 400):
            b.range(CONTAINER, start, end, thread=thread)
        for start, end in _random_ranges(rng, 5, 400):
            b.range(SYNC_OP, start, end, thread=thread, kind=RangeKind.CPU_OP)
        for start, end in _random_ranges(rng, 5, 400):
            b.api_call("cudaStreamSynchronize", start, max(end, start), thread=thread)
        for start, _ in _random_ranges(rng, 4, 400):  # blocking copies: launch to copy end
            b.kernel(
                "Memcpy DtoH (Device -> Pageable)",
                start,
                start + 5,
                30,
                thread=thread,
                kind=ActivityKind.MEMCPY,
                api="cudaMemcpyAsync",
            )
    for thread in (1, 2, 3):
        for start, end in _random_ranges(rng, 15, 400):
            b.range("aten::add", start, end, thread=thread, kind=RangeKind.CPU_OP)
        for start, end in _random_ranges(rng, 8, 400):
            b.range("train.py(12): step", start, end, thread=thread, kind=RangeKind.PYTHON)
    trace = b.build()
    catalog = load_catalog(use_env=False)
    ranges = match_ranges(trace, catalog)
    syncs = host_syncs(trace, catalog, attribute(trace, catalog, ranges))
    return HostStates(trace, ranges, set(), syncs, block=block)


def _trace(seed: int) -> _BlockStates:
    """``_states``' lookups, every thread in one block."""
    host = _states(seed)
    assert len(host._edges) == 0
    return host._block(0)


@pytest.mark.parametrize("seed", range(12))
def test_interval_states_are_the_cutting_lookups_at_each_first_instant(seed: int) -> None:
    host = _trace(seed)
    iv = host._intervals
    assert set(host._bounds) == {1, 2}
    for thread, bounds in host._bounds.items():
        at = iv.offset[thread]
        assert iv.kind[at] == _OPEN  # interval 0: before every cutting range
        time = bounds.astype(np.int64)
        kind, value = host._chain(np.full(len(time), thread), time, host._cutting)
        np.testing.assert_array_equal(iv.kind[at + 1 : at + 1 + len(time)], kind)
        np.testing.assert_array_equal(iv.value[at + 1 : at + 1 + len(time)], value)
        assert np.array_equal(iv.first[at + 1 : at + 1 + len(time)], time)
    assert iv.kind[iv.dummy] == _OPEN and iv.dummy == len(iv.kind) - 1


@pytest.mark.parametrize("seed", range(12))
def test_split_pieces_are_labelled_as_the_generic_lookups_label_them(seed: int) -> None:
    host = _trace(seed)
    rng = np.random.default_rng(1000 + seed)
    n = 400
    thread = rng.integers(1, 5, n).astype(np.int64)
    lo = rng.integers(-20, 420, n).astype(np.int64)
    on_bound = rng.integers(0, 3, n) == 0  # a third start exactly on a boundary
    for i in np.flatnonzero(on_bound):
        if int(thread[i]) in host._bounds:
            bounds = host._bounds[int(thread[i])]
            lo[i] = bounds[int(rng.integers(0, len(bounds)))]
    hi = lo + rng.integers(0, 120, n)
    cut = np.minimum(hi, lo + rng.integers(0, 150, n))
    query, start, end, interval = host.split(thread, lo, cut, hi)

    # the pieces: [lo, hi) of each query, cut at its thread's boundaries inside (lo, cut)
    expected: list[tuple[int, int, int]] = []
    for i in range(n):
        bounds = host._bounds.get(int(thread[i]), np.empty(0, dtype=np.int64))
        inner = [int(x) for x in bounds if lo[i] < x < cut[i]]
        edges = [int(lo[i]), *inner, int(hi[i])]
        expected += [(i, a, z) for a, z in itertools.pairwise(edges) if z > a]
    assert list(zip(query.tolist(), start.tolist(), end.tolist(), strict=True)) == expected

    fast = host.labels(thread[query], start, interval)
    generic = host.labels(thread[query], start)
    np.testing.assert_array_equal(fast.type, generic.type)
    np.testing.assert_array_equal(fast.value, generic.value)
    np.testing.assert_array_equal(fast.detail, generic.detail)
    assert set(fast.type.tolist()) >= {LabelType.HELPER, LabelType.SYNC}


@pytest.mark.parametrize("seed", range(20))
def test_one_family_of_overlapping_ranges_matches_range_index_lookup(seed: int) -> None:
    """A single family with heavy partial overlap (where ``lookup`` is not "innermost") on
    three threads, one of them with degenerate ranges only."""
    rng = np.random.default_rng(seed)
    rows = [
        (thread, s, e) for thread, n in ((5, 60), (9, 40)) for s, e in _random_ranges(rng, n, 300)
    ] + [(7, 50, 50), (7, 80, 70)]
    thread = np.array([r[0] for r in rows], dtype=np.int64)
    start = np.array([r[1] for r in rows], dtype=np.int64)
    end = np.array([r[2] for r in rows], dtype=np.int64)
    index = RangeIndex(thread, start, end, np.arange(len(rows), dtype=np.int64))
    values = np.append(np.arange(len(rows), dtype=np.int64) * 10, -1)
    span = _span(index, LabelType.HELPER, values, start, end, None, None)
    bounds, ranks = _boundaries([span])
    iv = _interval_states(bounds, [span], ranks)
    assert iv.degenerate
    for t, b in bounds.items():
        np.testing.assert_array_equal(
            b, np.unique(np.concatenate([start, end])[np.tile(thread, 2) == t])
        )
        rows_found = index.lookup(np.full(len(b), t), b)
        at = iv.offset[t]
        want = np.where(rows_found >= 0, values[rows_found], -1)
        np.testing.assert_array_equal(iv.value[at + 1 : at + 1 + len(b)], want)
        np.testing.assert_array_equal(
            iv.kind[at + 1 : at + 1 + len(b)], np.where(rows_found >= 0, LabelType.HELPER, _OPEN)
        )
        degenerate_starts = np.unique(start[(thread == t) & (end <= start)])
        unstable = np.flatnonzero(iv.unstable[at : at + len(b) + 1])
        np.testing.assert_array_equal(b[unstable - 1], degenerate_starts)


@pytest.mark.parametrize("seed", range(6))
def test_states_built_block_by_block_answer_as_one_block(seed: int) -> None:
    """Blocks of one thread each (threads 1, 2, 3 with ranges; thread 4 with none falls in the
    last block) cut and label every query as one block of every thread does, in one order."""
    whole, blocked = _states(seed), _states(seed, block=1)
    assert len(blocked._edges) == 2  # threads 1 | 2 | 3 and above
    rng = np.random.default_rng(2000 + seed)
    n = 500
    thread = rng.integers(0, 6, n).astype(np.int64)
    lo = rng.integers(-20, 420, n).astype(np.int64)
    hi = lo + rng.integers(0, 120, n)
    cut = np.minimum(hi, lo + rng.integers(0, 150, n))
    one = whole.split_labels(thread, lo, cut, hi)
    each = blocked.split_labels(thread, lo, cut, hi)
    for a, b in zip(one[:3], each[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    for field in ("type", "value", "detail"):
        np.testing.assert_array_equal(getattr(one[3], field), getattr(each[3], field))
    assert len(set(thread[one[0]].tolist())) >= 4
    assert set(one[3].type.tolist()) >= {LabelType.HELPER, LabelType.SYNC, LabelType.RANGE}
