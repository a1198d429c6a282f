"""Change points of a metric's history: where a branch's series shifted, and by how much.

Method (binary segmentation with a rank test): over a segment, every split leaving at least
``min_segment`` points on each side is scored by the Mann-Whitney U p-value of "before" vs
"after" (:func:`analyzers.stats.mann_whitney_u`); the best split is a change point when its
p-value, Bonferroni-corrected for the number of splits tried, is below ``alpha`` *and* the
medians differ by at least ``min_shift_pct`` percent. Then both sides are searched again, up to
``max_points`` change points. Rank-based, so one outlier run neither makes nor hides a shift;
medians and a minimum shift, so a significant but negligible drift is not flagged.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from analyzers.stats import mann_whitney_u

METHOD = (
    "binary segmentation; each split scored by a two-sided Mann-Whitney U test, "
    "Bonferroni-corrected over the splits tried, plus a minimum shift of the medians"
)


@dataclass(frozen=True, slots=True)
class ChangePoint:
    """The series changed between ``index - 1`` and ``index`` (``index`` is the first point of
    the new level)."""

    index: int
    before_median: float
    after_median: float
    shift_pct: float
    p_value: float


def _best_split(
    values: Sequence[float], lo: int, hi: int, min_segment: int
) -> tuple[int, float, int] | None:
    """(split, p-value, splits tried) of the segment ``values[lo:hi]``; None if too short."""
    splits = range(lo + min_segment, hi - min_segment + 1)
    if len(splits) == 0:
        return None
    best: tuple[int, float] | None = None
    for k in splits:
        _, p = mann_whitney_u(values[lo:k], values[k:hi])
        if best is None or p < best[1]:
            best = (k, p)
    assert best is not None
    return best[0], best[1], len(splits)


def change_points(
    values: Sequence[float],
    *,
    alpha: float = 0.05,
    min_shift_pct: float = 3.0,
    min_segment: int = 4,
    max_points: int = 5,
) -> list[ChangePoint]:
    """Change points of ``values`` (oldest first), in series order."""
    found: list[ChangePoint] = []
    segments = [(0, len(values))]
    while segments and len(found) < max_points:
        lo, hi = segments.pop(0)
        split = _best_split(values, lo, hi, min_segment)
        if split is None:
            continue
        k, p, tried = split
        before, after = statistics.median(values[lo:k]), statistics.median(values[k:hi])
        shift = 100.0 * (after - before) / before if before else 0.0
        if min(1.0, p * tried) >= alpha or abs(shift) < min_shift_pct:
            continue
        found.append(ChangePoint(k, before, after, shift, min(1.0, p * tried)))
        segments += [(lo, k), (k, hi)]
    return sorted(found, key=lambda c: c.index)


__all__ = ["METHOD", "ChangePoint", "change_points"]
