"""Union of intervals per segment: the one implementation every busy/idle figure uses.

Why one function: stream busy time, per-window GPU busy time and the timeline decomposition
all reduce to "length of the union of [start, end) intervals per segment"; two versions would
drift apart (one clipping, one not) and the figures would stop adding up.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

GAP_THRESHOLD_NS = 10_000
"""Idle time on a stream shorter than this is launch jitter, not a gap worth reporting."""


def union_order(seg: IntArray, start: IntArray) -> IntArray:
    """The row order ``interval_union`` works in (by segment, then start): callers taking several
    unions of subsets of the same rows sort once and pass ``presorted=True`` (a subset of sorted
    rows, taken with a mask, stays sorted)."""
    if len(start) == 0:
        return np.empty(0, dtype=np.int64)
    base, width = int(start.min()), int(start.max()) - int(start.min()) + 1
    lo, hi = int(seg.min()), int(seg.max())
    if (hi - lo + 1) * width < (1 << 62):
        # one int64 key (segment, then start): a single argsort is several times faster than
        # numpy's two-key lexsort on millions of rows
        return np.argsort((seg - lo) * width + (start - base), kind="stable")
    return np.lexsort((start, seg))


def interval_union(
    seg: IntArray, start: IntArray, end: IntArray, n_segments: int, *, presorted: bool = False
) -> tuple[IntArray, IntArray, IntArray]:
    """Per segment: union length, number of gaps > threshold, and their summed length.

    Inputs need not be sorted (unless ``presorted`` says they are in ``union_order``). Segment
    ids index the outputs (length ``n_segments``).
    """
    busy = np.zeros(n_segments, dtype=np.int64)
    gaps = np.zeros(n_segments, dtype=np.int64)
    gap_ns = np.zeros(n_segments, dtype=np.int64)
    if len(start) == 0:
        return busy, gaps, gap_ns
    if not presorted:
        order = union_order(seg, start)
        seg, start, end = seg[order], start[order], end[order]
    end = np.maximum(end, start)
    base = int(start.min())
    s, e = start - base, end - base
    width = int(e.max()) + 1
    if n_segments * width < (1 << 62):
        reach = np.maximum.accumulate(e + seg * width) - seg * width
    else:  # too wide for one offset trick: per segment
        reach = np.empty_like(e)
        for sid in np.unique(seg):
            rows = seg == sid
            reach[rows] = np.maximum.accumulate(e[rows])
    first = np.ones(len(s), dtype=bool)
    first[1:] = seg[1:] != seg[:-1]
    new_piece = first.copy()
    new_piece[1:] |= s[1:] > reach[:-1]
    piece_starts = np.flatnonzero(new_piece)
    piece_end = np.maximum.reduceat(e, piece_starts)
    piece_seg = seg[piece_starts]
    np.add.at(busy, piece_seg, piece_end - s[piece_starts])
    # A gap is the space between consecutive pieces of one segment.
    same = piece_seg[1:] == piece_seg[:-1]
    gap = s[piece_starts[1:]] - piece_end[:-1]
    counted = same & (gap > GAP_THRESHOLD_NS)
    np.add.at(gaps, piece_seg[1:][counted], 1)
    np.add.at(gap_ns, piece_seg[1:][counted], gap[counted])
    return busy, gaps, gap_ns


__all__ = ["GAP_THRESHOLD_NS", "interval_union", "union_order"]
