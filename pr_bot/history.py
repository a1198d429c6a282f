"""The base side of the time gate from history: pool the last K runs, after any change point.

Why pool: one base run's iteration times hold that run's noise only; the spread between runs
of the same code (another node, a clock state, the allocator) is larger, and K runs of the base
branch carry it, so a pull request is not failed for a quiet baseline. Why change points
(asv-style step detection, :func:`analyzers.changepoint.change_points` on the runs' medians):
when the base branch itself moved, pooling across the step mixes two levels; the runs after
the newest change point are pooled, and the step is reported, not hidden.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from analyzers.changepoint import change_points
from analyzers.report import AnalysisReport


@dataclass(frozen=True, slots=True)
class HistoryRun:
    """One base-branch run's iteration times of one window group (ms)."""

    run_id: int
    label: str
    samples: list[float]


@dataclass(frozen=True, slots=True)
class PooledBase:
    """The pooled base samples, which runs they came from, and what to say about them."""

    samples: list[float]
    run_ids: list[int]
    lines: list[str] = field(default_factory=list)


def iteration_samples(report: AnalysisReport, group: str, source: str | None) -> list[float]:
    """The all-ranks iteration times of ``group`` when their source matches (timed iterations
    and profiled window durations are not comparable); empty otherwise."""
    for it in report.iterations:
        if it.label == group and it.rank is None and it.source == source:
            return list(it.samples_ms)
    return []


def pool_history(
    history: Sequence[HistoryRun], k: int, *, min_shift_pct: float, base_ref: str
) -> PooledBase:
    """Pool the newest ``k`` runs of ``history`` (newest first, each with samples) after its
    newest change point."""
    runs = [h for h in history if h.samples]
    if not runs:
        return PooledBase([], [])
    lines: list[str] = []
    level = len(runs)
    oldest_first = runs[::-1]
    medians = [statistics.median(h.samples) for h in oldest_first]
    found = change_points(medians, min_shift_pct=min_shift_pct)
    for cp in found:
        at = oldest_first[cp.index]
        lines.append(
            f"{base_ref} history ({len(runs)} runs): change point at {at.label}: median "
            f"{cp.before_median:.2f} -> {cp.after_median:.2f} ms ({cp.shift_pct:+.1f}%, "
            f"p={cp.p_value:.2g})"
        )
    if found:
        level = len(runs) - found[-1].index  # runs at the newest level, newest first
    pooled = runs[: max(1, min(k, level))]
    samples = [x for h in pooled for x in h.samples]
    if len(pooled) > 1:
        cut = " after the newest change point" if found and level < len(runs) else ""
        lines.append(
            f"base iteration times pooled from the last {len(pooled)} runs of {base_ref}{cut} "
            f"(n={len(samples)}: " + ", ".join(h.label for h in pooled) + ")"
        )
    return PooledBase(samples, [h.run_id for h in pooled], lines)


__all__ = ["HistoryRun", "PooledBase", "iteration_samples", "pool_history"]
