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

Method of :func:`relative_shift` (what the pull-request gate decides by, ``pr_bot.policy``):

* model: head = base x (1 + shift), i.e. a location shift of ``log`` iteration times;
* estimate: the Hodges-Lehmann shift of the logs, ``exp(median_ij(log h_j - log b_i)) - 1``;
* confidence interval: the distribution-free interval of that shift from the order statistics
  of the ``m x n`` pairwise differences (Moses; Hollander & Wolfe): ``[D_(C), D_(mn+1-C)]``
  with ``C`` the largest count for which ``P(U < C) <= alpha / 2`` under the null distribution
  of the Mann-Whitney U. Its coverage is exact at every n for continuous data; a bootstrap of
  the median with n=3 is not (it can only return values of the samples);
* p-value: Mann-Whitney U, two-sided, from the *exact* null distribution when there are no ties
  and ``m * n <= EXACT_MAX_PAIRS``; else the normal approximation of :func:`mann_whitney_u`;
* too few samples: the smallest two-sided p of m vs n samples is ``2 / C(m + n, m)``; when it is
  above ``alpha`` no data can give an interval, and :func:`samples_needed` says how many would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

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


EXACT_MAX_PAIRS = 20_000
"""Above this many pairs (m x n) the U distribution is the normal approximation."""
MAX_SIDE = 2_000
"""A side with more samples is thinned to this many evenly spaced order statistics (a
conservative interval; keeps the m x n pairwise differences in memory)."""


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the ``C(m + n, m)`` orderings give U = 0, 1, ..., m*n (no ties): the
    coefficients of the Gaussian binomial ``[m + n choose m]_q``, built one factor
    ``(1 - q^(n+i)) / (1 - q^i)`` at a time so every step is exact integer arithmetic."""
    m, n = min(m, n), max(m, n)
    poly = [1]
    for i in range(1, m + 1):
        shift = n + i
        grown = poly + [0] * shift
        for j, c in enumerate(poly):
            grown[j + shift] -= c
        for j in range(i, len(grown)):
            grown[j] += grown[j - i]
        poly = grown[: i * n + 1]
    return tuple(poly)


def _u_cdf(m: int, n: int) -> npt.NDArray[np.float64]:
    """``P(U <= u)`` for u = 0 .. m*n under the null hypothesis (no ties)."""
    counts = _u_counts(m, n)
    total = math.comb(m + n, m)
    running, out = 0, []
    for c in counts:
        running += c
        out.append(running / total)
    return np.asarray(out, dtype=float)


def smallest_p(m: int, n: int) -> float:
    """The smallest two-sided Mann-Whitney p-value ``m`` vs ``n`` samples can ever give."""
    return min(1.0, 2.0 / math.comb(m + n, m)) if m and n else 1.0


def samples_needed(m: int, n: int, alpha: float) -> tuple[int, int]:
    """(per side when both are equal, head samples against these ``m`` base samples): the
    fewest samples whose smallest two-sided p is at or below ``alpha``."""
    equal = next(k for k in range(1, 64) if smallest_p(k, k) <= alpha)
    head = next(k for k in range(1, 10_000) if smallest_p(max(m, 1), k) <= alpha)
    return equal, head


def mann_whitney_exact_p(base: Sequence[float], head: Sequence[float]) -> tuple[float, bool]:
    """Two-sided Mann-Whitney p-value, and whether it is exact (no ties, ``m*n`` small enough;
    otherwise the tie-corrected normal approximation of :func:`mann_whitney_u`)."""
    a, b = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    m, n = a.size, b.size
    if m == 0 or n == 0:
        return 1.0, True
    u, p_normal = mann_whitney_u(base, head)
    tied = np.unique(np.concatenate([a, b])).size < m + n
    if tied or m * n > EXACT_MAX_PAIRS:
        return float(p_normal), False
    cdf = _u_cdf(m, n)
    k = round(u)
    lower = cdf[k]
    upper = 1.0 - (cdf[k - 1] if k > 0 else 0.0)  # P(U >= k)
    return min(1.0, 2.0 * min(lower, upper)), True


def _order_count(m: int, n: int, alpha: float) -> int:
    """C: the largest count with ``P(U < C) <= alpha / 2`` (0: no interval exists)."""
    if m * n <= EXACT_MAX_PAIRS:
        cdf = _u_cdf(m, n)
        below = np.concatenate([[0.0], cdf])  # below[c] = P(U < c) = P(U <= c - 1)
        return int(np.flatnonzero(below <= alpha / 2 + 1e-12).max())
    z = float(np.sqrt(2.0) * _erfinv(1.0 - alpha))
    c = m * n / 2.0 - z * math.sqrt(m * n * (m + n + 1) / 12.0)
    return max(0, math.floor(c))


def _erfinv(y: float) -> float:
    """Inverse error function by bisection on ``math.erf`` (a quantile, once per call)."""
    lo, hi = 0.0, 6.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return (lo + hi) / 2


def _thin(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    if values.size <= MAX_SIDE:
        return values
    ordered = np.sort(values)
    picked: npt.NDArray[np.float64] = ordered[
        np.linspace(0, ordered.size - 1, MAX_SIDE).round().astype(int)
    ]
    return picked


@dataclass(frozen=True, slots=True)
class RelativeShift:
    """head / base - 1 of two timing samples, with its confidence interval (fractions, not %).

    ``low``/``high`` are None when ``m`` vs ``n`` samples can give no interval at this
    confidence (:func:`smallest_p` above ``1 - confidence``)."""

    n_base: int
    n_head: int
    point: float
    low: float | None
    high: float | None
    p_value: float
    exact_p: bool
    confidence: float
    method: str

    @property
    def decidable(self) -> bool:
        return self.low is not None and self.high is not None


def relative_shift(
    base: Sequence[float], head: Sequence[float], *, confidence: float = 0.95
) -> RelativeShift:
    """The relative shift of ``head`` against ``base`` (module docstring: method).

    :raises ValueError: when a side is empty or holds a time that is not positive.
    """
    a, b = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("relative_shift: a side has no samples")
    if (a <= 0).any() or (b <= 0).any() or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("relative_shift: iteration times must be positive and finite")
    p_value, exact = mann_whitney_exact_p(base, head)
    la, lb = np.log(_thin(a)), np.log(_thin(b))
    diffs = np.sort((lb[None, :] - la[:, None]).ravel())
    m, n = la.size, lb.size
    alpha = 1.0 - confidence
    c = _order_count(m, n, alpha)
    low = high = None
    if c >= 1:
        low, high = float(np.expm1(diffs[c - 1])), float(np.expm1(diffs[m * n - c]))
    thinned = " (thinned to evenly spaced order statistics)" if (m, n) != (a.size, b.size) else ""
    method = (
        f"Hodges-Lehmann shift of log times with its distribution-free {confidence:.0%} CI "
        f"(Mann-Whitney order statistics, {m} vs {n}{thinned}); Mann-Whitney U two-sided, "
        + ("exact" if exact else "normal approximation (ties or large n)")
    )
    return RelativeShift(
        n_base=int(a.size),
        n_head=int(b.size),
        point=float(np.expm1(np.median(diffs))),
        low=low,
        high=high,
        p_value=p_value,
        exact_p=exact,
        confidence=confidence,
        method=method,
    )


__all__ = [
    "EXACT_MAX_PAIRS",
    "NO_INTERVAL",
    "RelativeShift",
    "bootstrap_median_diff_ci",
    "compare_samples",
    "hodges_lehmann",
    "iteration_stats",
    "mann_whitney_exact_p",
    "mann_whitney_u",
    "relative_shift",
    "samples_needed",
    "smallest_p",
]
