"""``Union.of`` (one running maximum of the ends) against merging the touching first-come
``owned`` pieces in plain Python, the rule it must equal: the same pieces and the same opening
and closing rows (the rows name the activity before and after each idle gap, whose launching
thread the gap is attributed to)."""

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


def _merged_owned_pieces(
    seg: np.ndarray, start: np.ndarray, end: np.ndarray
) -> list[tuple[int, int, int, int, int]]:
    """(segment, start, end, opening row, closing row) of the union: the non-empty owned
    pieces in (segment, start) order, touching ones of one segment merged."""
    mine = owned(seg, start, end)
    order = mine.order.tolist() if mine.order is not None else list(range(len(seg)))
    out: list[list[int]] = []
    for i in order:
        lo, hi = int(mine.piece_start[i]), int(mine.piece_end[i])
        if hi <= lo:
            continue
        if out and out[-1][0] == seg[i] and lo <= out[-1][2]:
            out[-1][2], out[-1][4] = hi, i
        else:
            out.append([int(seg[i]), lo, hi, i, i])
    return [tuple(p) for p in out]  # type: ignore[misc]


def _both(seg: np.ndarray, start: np.ndarray, end: np.ndarray, in_order: bool | None) -> None:
    union = Union.of(seg, start, end, with_rows=True, in_order=in_order)
    got = list(
        zip(
            union.seg.tolist(),
            union.start.tolist(),
            union.end.tolist(),
            union.first_row.tolist(),
            union.last_row.tolist(),
            strict=True,
        )
    )
    assert got == _merged_owned_pieces(seg, start, end)
    plain = Union.of(seg, start, end, in_order=in_order)
    for name in ("seg", "start", "end"):
        assert getattr(plain, name).tolist() == getattr(union, name).tolist(), name


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


@pytest.mark.parametrize("seed", range(20))
def test_before_each_steps_to_the_same_answer_as_a_search(seed: int) -> None:
    """Later times step on from where the first landed; any distance (past ``_STEPS``
    pieces, past the last piece, into another segment's range) gives the searched answer."""
    seg, start, end = _random(seed + 100, n=200, segments=3)
    union = Union.of(seg, start, end)
    rng = np.random.default_rng(seed)
    q_seg = np.sort(rng.integers(0, 4, 300)).astype(np.int64)  # segment 3 has no pieces
    lo = rng.integers(-20, 240, 300).astype(np.int64)
    mid = lo + rng.integers(0, 3, 300)
    hi = lo + rng.integers(0, 260, 300)
    got = union.before_each(q_seg, lo, hi, mid)
    searched = [union.before_each(q_seg, t)[0] for t in (lo, hi, mid)]
    for a, b in zip(got, searched, strict=True):
        assert a.tolist() == b.tolist()
    # and against a plain sum over the pieces
    pieces = list(zip(union.seg.tolist(), union.start.tolist(), union.end.tolist(), strict=True))
    for i in range(0, 300, 7):
        expect = sum(max(0, min(e, int(hi[i])) - s) for g, s, e in pieces if g == q_seg[i])
        assert got[1][i] == expect
    assert union.covered(q_seg, lo, hi).tolist() == (got[1] - got[0]).tolist()
