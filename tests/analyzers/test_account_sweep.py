"""``Union.of`` straight from the intervals against the union of their ``owned`` pieces.

The account builds the union of every activity of a window (and of its computation and NCCL)
with one running maximum (``Union._of_intervals``) instead of merging first-come pieces; both
must give the same pieces and the same opening and closing rows (the rows name the activity
before and after each idle gap, whose launching thread the gap is attributed to)."""

from __future__ import annotations

import numpy as np
import pytest

from analyzers.intervals import interval_union
from analyzers.sweep import Union, owned


def _random(seed: int, n: int, segments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    seg = np.sort(rng.integers(0, segments, n)).astype(np.int64)
    start = rng.integers(0, 200, n).astype(np.int64)
    length = rng.integers(-3, 25, n)  # some zero-length and inverted (end < start) rows
    length[rng.random(n) < 0.2] = 0
    end = start + length
    order = np.lexsort((start, seg))
    return seg[order], start[order], end[order]


def _both(seg: np.ndarray, start: np.ndarray, end: np.ndarray, in_order: bool | None) -> None:
    direct = Union.of(seg, start, end, with_rows=True, in_order=in_order)
    merged = Union.of(seg, start, end, mine=owned(seg, start, end, in_order), with_rows=True)
    for name in ("seg", "start", "end", "first_row", "last_row"):
        assert getattr(direct, name).tolist() == getattr(merged, name).tolist(), name
    plain = Union.of(seg, start, end, in_order=in_order)
    for name in ("seg", "start", "end"):
        assert getattr(plain, name).tolist() == getattr(direct, name).tolist(), name


@pytest.mark.parametrize("seed", range(40))
def test_direct_union_matches_owned_pieces(seed: int) -> None:
    seg, start, end = _random(seed, n=1 + seed * 7, segments=1 + seed % 5)
    _both(seg, start, end, in_order=True)
    _both(seg, start, end, in_order=None)
    shuffled = np.random.default_rng(seed).permutation(len(seg))
    _both(seg[shuffled], start[shuffled], end[shuffled], in_order=None)


def test_direct_union_lengths_match_interval_union() -> None:
    seg, start, end = _random(7, n=500, segments=4)
    union = Union.of(seg, start, end, with_rows=True)
    lengths = np.bincount(union.seg, weights=union.end - union.start, minlength=4)
    expected, _, _ = interval_union(seg, start, np.maximum(end, start), 4)
    assert lengths.astype(np.int64).tolist() == expected.tolist()


def test_zero_length_row_does_not_join_pieces() -> None:
    # [0, 5), a zero-length row at 5, then [5, 9) touching the first: one piece; [12, 12)
    # alone between [10, 11) and [12, 15): they stay two pieces, and the rows are the real ones
    seg = np.zeros(6, dtype=np.int64)
    start = np.array([0, 5, 5, 10, 12, 12], dtype=np.int64)
    end = np.array([5, 5, 9, 11, 12, 15], dtype=np.int64)
    union = Union.of(seg, start, end, with_rows=True, in_order=True)
    assert list(zip(union.start.tolist(), union.end.tolist(), strict=True)) == [
        (0, 9),
        (10, 11),
        (12, 15),
    ]
    assert union.first_row.tolist() == [0, 3, 5]
    assert union.last_row.tolist() == [2, 3, 5]


def test_empty_and_all_zero_length() -> None:
    none = np.empty(0, dtype=np.int64)
    assert len(Union.of(none, none, none, with_rows=True).start) == 0
    flat = np.array([3, 4], dtype=np.int64)
    assert len(Union.of(np.zeros(2, dtype=np.int64), flat, flat, with_rows=True).start) == 0
