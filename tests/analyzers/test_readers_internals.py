"""Reader building blocks: range nesting, the streaming JSON scanner, factorize, sniffing."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from analyzers.errors import CorruptTraceError, UnsupportedTraceError
from analyzers.readers._arrays import factorize
from analyzers.readers._cuda_api import is_launch_api, normalize_api
from analyzers.readers._json_stream import iter_events
from analyzers.readers._nesting import _group_ids, _sorted_order, nest

I64 = np.int64


def test_nesting_docstring_example() -> None:
    start = np.array([0, 10, 20, 60, 100], dtype=I64)
    end = np.array([100, 50, 30, 90, 120], dtype=I64)
    parent, depth = nest(np.ones(5, dtype=I64), start, end)
    assert parent.tolist() == [-1, 0, 1, 0, -1]
    assert depth.tolist() == [0, 1, 2, 1, 0]


def test_nesting_is_per_thread_and_order_independent() -> None:
    thread = np.array([2, 1, 1, 2, 1], dtype=I64)
    start = np.array([5, 20, 0, 0, 10], dtype=I64)
    end = np.array([6, 30, 100, 10, 50], dtype=I64)
    parent, depth = nest(thread, start, end)
    # thread 1: row 2 [0,100] > row 4 [10,50] > row 1 [20,30]; thread 2: row 3 [0,10] > row 0
    assert parent.tolist() == [3, 4, -1, -1, 2]
    assert depth.tolist() == [1, 2, 0, 0, 1]


def test_nesting_families_do_not_mix() -> None:
    # a record_function range [5, 50] straddles Python frames [0, 10] and [40, 100]
    thread = np.zeros(3, dtype=I64)
    start = np.array([0, 5, 40], dtype=I64)
    end = np.array([10, 50, 100], dtype=I64)
    family = np.array([1, 0, 1])
    parent, depth = nest(thread, start, end, family)
    assert parent.tolist() == [-1, -1, -1]
    assert depth.tolist() == [0, 0, 0]


def test_badly_nested_ranges_never_get_a_parent_that_does_not_enclose_them() -> None:
    rng = np.random.default_rng(7)
    start = rng.integers(0, 1000, 400).astype(I64)
    end = start + rng.integers(0, 200, 400)
    thread = rng.integers(0, 3, 400).astype(I64)
    parent, _ = nest(thread, start, end)
    child = np.flatnonzero(parent >= 0)
    assert len(child) > 0
    p = parent[child]
    assert (thread[p] == thread[child]).all()
    assert (start[p] <= start[child]).all()
    assert (end[p] >= start[child]).all()


@pytest.mark.parametrize("threads", [3, 100])  # few threads (masked ids) and many (a sort)
def test_nesting_of_rows_in_start_order_equals_nesting_of_shuffled_rows(threads: int) -> None:
    """Rows already in start order per thread skip the time sort; the result is the same as
    for the same ranges in any other row order, tied starts included (in both end orders)."""
    rng = np.random.default_rng(11)
    n = 3000
    thread = rng.integers(0, threads, n).astype(I64) << 24
    start = np.sort(rng.integers(0, 5000, n)).astype(I64)  # many ties
    end = start + rng.integers(0, 300, n)
    family = rng.integers(0, 2, n)
    # identical ranges nest by row order (the first encloses the second): keep one of each
    _, first = np.unique(np.column_stack((thread, start, end, family)), axis=0, return_index=True)
    keep = np.sort(first)
    thread, start, end, family = thread[keep], start[keep], end[keep], family[keep]
    n = len(keep)
    for ends_down in (True, False):  # tied starts: end descending (in order) or ascending
        order = np.lexsort((-end if ends_down else end, start))
        rows = (thread[order], start[order], end[order], family[order])
        parent, depth = nest(*rows)
        shuffle = rng.permutation(n)
        back = np.argsort(shuffle)
        shuffled_parent, shuffled_depth = nest(*(column[shuffle] for column in rows))
        assert np.array_equal(depth, shuffled_depth[back])
        # parents are row indices: map the shuffled rows' parents back to these rows
        mapped = np.where(shuffled_parent >= 0, shuffle[np.maximum(shuffled_parent, 0)], -1)
        assert np.array_equal(parent, mapped[back])
        assert (depth > 0).sum() > n // 4  # the ranges do nest
        group = _group_ids(rows[0], rows[3])
        lexsorted = np.lexsort((-rows[2], rows[1], group))
        assert np.array_equal(_sorted_order(group, rows[1], rows[2]), lexsorted)


def test_epoch_nanosecond_timestamps_nest() -> None:
    base = np.int64(1_790_857_026_000_000_000)
    start = base + np.array([0, 10], dtype=I64)
    end = base + np.array([100, 20], dtype=I64)
    thread = np.array([1, 1], dtype=I64) << 40
    parent, depth = nest(thread, start, end)
    assert parent.tolist() == [-1, 0]
    assert depth.tolist() == [0, 1]


def _events(text: str) -> tuple[list[object], dict[str, object]]:
    header: dict[str, object] = {}
    return list(iter_events(io.StringIO(text), "t.json", header)), header


def test_scanner_keeps_keys_before_and_after_the_events() -> None:
    doc = {"schemaVersion": 1, "traceEvents": [{"ph": "X"}, {"ph": "M"}], "traceName": "r0"}
    events, header = _events(json.dumps(doc, indent=2))
    assert events == [{"ph": "X"}, {"ph": "M"}]
    assert header == {"schemaVersion": 1, "traceName": "r0"}


def test_scanner_accepts_a_top_level_array() -> None:
    events, _ = _events('[{"ph": "X", "ts": 1.5}, {"ph": "X", "ts": 2}]')
    assert len(events) == 2


def test_scanner_errors() -> None:
    with pytest.raises(UnsupportedTraceError, match="no 'traceEvents'"):
        _events('{"a": 1}')
    with pytest.raises(CorruptTraceError, match="ended before"):
        _events('{"traceEvents": [{"ph": "X"}')
    with pytest.raises(CorruptTraceError, match="malformed JSON"):
        _events('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}')


def test_factorize_matches_unique() -> None:
    values = np.array([7, 3, 7, 1_000, 3, -2], dtype=I64)
    unique, inverse = factorize(values)
    assert unique.tolist() == [-2, 3, 7, 1_000]
    assert (unique[inverse] == values).all()
    sparse = np.array([1 << 40, 5, 1 << 40], dtype=I64)  # too sparse for a lookup table
    unique, inverse = factorize(sparse)
    assert (unique[inverse] == sparse).all()


@pytest.mark.parametrize(
    ("name", "launch"),
    [
        ("cudaLaunchKernel_v7000", True),
        ("cuLaunchKernelEx", True),
        ("cudaGraphLaunch_v10000", True),
        ("cudaMemcpyAsync_v3020", True),
        ("cudaMemsetAsync", True),
        ("cudaLaunchHostFunc_v10000", False),
        ("cudaStreamSynchronize_v3020", False),
        ("cuKernelGetName", False),
    ],
)
def test_launch_api_names(name: str, launch: bool) -> None:
    assert is_launch_api(name) is launch
    assert not normalize_api(name).endswith(("_v7000", "_v10000", "_v3020"))
