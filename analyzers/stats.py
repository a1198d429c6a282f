"""Robust statistics for iteration times: summaries and a base-vs-head comparison.

Why robust: GPU iteration times have outliers (a clock ramp, an allocator growth, a straggling
collective) that skew means; DESIGN's reference numbers disagree by arm only in the median.

Method of :func:`compare_samples` (stated in every result's ``method``):

* effect: ``median(head) - median(base)`` in ms (and as % of the base median), plus the
  Hodges-Lehmann shift (median of all pairwise ``head_j - base_i``) as a cross-check;
* confidence interval: percentile bootstrap of the median difference, both samples resampled
  independently, ``resamples`` times with a fixed ``seed`` (so a report is reproducible), capped
  at :data:`MAX_RESAMPLES`;
* significance: Mann-Whitney U, two-sided, normal approximation with tie correction and a 0.5
  continuity correction (exact enough for n >= 8 per side; with fewer samples it is conservative);
* verdict: "faster"/"slower" only when the p-value is below ``1 - confidence`` *and* the
  interval excludes zero; otherwise "no significant change".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from analyzers.report import IterationComparison, IterationStats

MAX_RESAMPLES = 10_000
DEFAULT_RESAMPLES = 2_000


def iteration_stats(
    label: str, samples: Sequence[float], rank: int | None = None, source: str | None = None
) -> IterationStats:
    """Median, p10/p90, IQR, mean, min and max of ``samples`` (ms).

    ``source`` says where the samples come from ("timed" CUDA-event iterations or "profiled"
    window durations); savings are only taken from timed ones.

    :raises ValueError: when ``samples`` is empty.
    """
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise ValueError(f"iteration_stats({label!r}): no samples")
    p10, p25, p50, p75, p90 = np.percentile(values, [10, 25, 50, 75, 90])
    return IterationStats(
        label=label,
        rank=rank,
        n=int(values.size),
        median_ms=float(p50),
        p10_ms=float(p10),
        p90_ms=float(p90),
        iqr_ms=float(p75 - p25),
        mean_ms=float(values.mean()),
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        samples_ms=[float(v) for v in values],
        source=source,
    )


def _average_ranks(
    values: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """1-based ranks with ties averaged, and the size of every tie group."""
    _uniques, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    average = upper - (counts - 1) / 2.0  # mean of the ranks (upper-counts+1 .. upper)
    return average[inverse.reshape(-1)], counts


def mann_whitney_u(base: Sequence[float], head: Sequence[float]) -> tuple[float, float]:
    """U statistic of ``head`` and its two-sided p-value (normal approximation, tie-corrected)."""
    a, b = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    n1, n2 = a.size, b.size
    if n1 == 0 or n2 == 0:
        return 0.0, 1.0
    ranks, ties = _average_ranks(np.concatenate([a, b]))
    u_head = float(ranks[n1:].sum() - n2 * (n2 + 1) / 2.0)
    n = n1 + n2
    tie_term = float((ties.astype(float) ** 3 - ties).sum()) / (n * (n - 1)) if n > 1 else 0.0
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if variance <= 0:
        return u_head, 1.0
    centred = u_head - n1 * n2 / 2.0
    z = max(abs(centred) - 0.5, 0.0) / math.sqrt(variance)
    return u_head, min(1.0, math.erfc(z / math.sqrt(2.0)))


def hodges_lehmann(base: Sequence[float], head: Sequence[float]) -> float:
    """Median of all pairwise differences ``head_j - base_i``."""
    a, b = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    return float(np.median(b[:, None] - a[None, :]))


def bootstrap_median_diff_ci(
    base: Sequence[float],
    head: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``median(head) - median(base)``."""
    a, b = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    resamples = max(1, min(resamples, MAX_RESAMPLES))
    rng = np.random.default_rng(seed)
    med_a = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
    med_b = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(med_b - med_a, [tail, 1.0 - tail])
    return float(low), float(high)


NO_INTERVAL = "n={n}: no interval"
"""What a comparison with a one-sample side says instead of its (zero-width) interval."""


def compare_samples(
    base: IterationStats,
    head: IterationStats,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> IterationComparison:
    """Compare two iteration-time distributions (see the module docstring for the method)."""
    delta = head.median_ms - base.median_ms
    low, high = bootstrap_median_diff_ci(
        base.samples_ms, head.samples_ms, confidence=confidence, resamples=resamples, seed=seed
    )
    _, p_value = mann_whitney_u(base.samples_ms, head.samples_ms)
    shift = hodges_lehmann(base.samples_ms, head.samples_ms)
    significant = p_value < (1.0 - confidence) and (high < 0 or low > 0)
    verdict = "no significant change"
    if significant:
        verdict = "faster" if delta < 0 else "slower"
    n_resamples = max(1, min(resamples, MAX_RESAMPLES))
    interval = min(base.n, head.n) > 1
    ci = (
        f"{confidence:.0%} percentile-bootstrap CI ({n_resamples} resamples, seed {seed})"
        if interval
        else NO_INTERVAL.format(n=min(base.n, head.n))
    )
    method = (
        f"difference of medians (Hodges-Lehmann shift {shift:+.3f} ms); {ci}; Mann-Whitney U "
        f"two-sided, normal approximation with tie correction (n={base.n} vs {head.n})"
    )
    return IterationComparison(
        base=base,
        head=head,
        delta_median_ms=delta,
        delta_median_pct=100.0 * delta / base.median_ms if base.median_ms else 0.0,
        ci_low_ms=low,
        ci_high_ms=high,
        confidence=confidence,
        interval=interval,
        p_value=p_value,
        method=method,
        verdict=verdict,
    )


__all__ = [
    "NO_INTERVAL",
    "bootstrap_median_diff_ci",
    "compare_samples",
    "hodges_lehmann",
    "iteration_stats",
    "mann_whitney_u",
]
