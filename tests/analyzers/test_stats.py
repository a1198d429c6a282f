"""Statistics: summaries, Mann-Whitney U against a brute-force reference, bootstrap CI, verdict."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from analyzers.stats import (
    bootstrap_median_diff_ci,
    compare_samples,
    hodges_lehmann,
    iteration_stats,
    mann_whitney_exact_p,
    mann_whitney_u,
    relative_shift,
    samples_needed,
    smallest_p,
)


def _reference_p(a: list[float], b: list[float]) -> tuple[float, float]:
    """U by pairwise counting and the textbook tie-corrected normal approximation."""
    u = sum(1.0 if y > x else 0.5 if y == x else 0.0 for x, y in itertools.product(a, b))
    values = a + b
    n, n1, n2 = len(values), len(a), len(b)
    ties = [values.count(v) for v in set(values)]
    var = n1 * n2 / 12 * ((n + 1) - sum(t**3 - t for t in ties) / (n * (n - 1)))
    z = max(abs(u - n1 * n2 / 2) - 0.5, 0) / math.sqrt(var)
    return u, math.erfc(z / math.sqrt(2))


def test_iteration_stats_percentiles() -> None:
    s = iteration_stats("arm", [float(x) for x in range(1, 11)], rank=0)
    assert (s.n, s.median_ms, s.min_ms, s.max_ms, s.mean_ms) == (10, 5.5, 1.0, 10.0, 5.5)
    assert s.p10_ms == pytest.approx(1.9) and s.p90_ms == pytest.approx(9.1)
    assert s.iqr_ms == pytest.approx(4.5)
    with pytest.raises(ValueError, match="no samples"):
        iteration_stats("empty", [])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1.0, 2, 3, 4, 5], [6.0, 7, 8, 9, 10]),
        ([1.0, 1, 2, 2, 3], [2.0, 3, 3, 4, 4, 5]),
        ([21.3, 21.2, 21.4, 21.1, 21.3], [18.6, 18.5, 18.7, 21.2, 18.6]),
    ],
)
def test_mann_whitney_matches_reference(a: list[float], b: list[float]) -> None:
    u, p = mann_whitney_u(a, b)
    ref_u, ref_p = _reference_p(a, b)
    assert u == pytest.approx(ref_u) and p == pytest.approx(ref_p)


def test_mann_whitney_known_value_and_degenerate() -> None:
    # scipy.stats.mannwhitneyu([1..5], [6..10], method="asymptotic") -> p = 0.01219
    assert mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])[1] == pytest.approx(0.01219, abs=1e-4)
    assert mann_whitney_u([3.0, 3.0], [3.0, 3.0])[1] == 1.0
    assert mann_whitney_u([], [1.0])[1] == 1.0


def test_hodges_lehmann_and_bootstrap_are_seeded() -> None:
    a = [10.0 + 0.1 * i for i in range(20)]
    b = [x - 2.0 for x in a]
    assert hodges_lehmann(a, b) == pytest.approx(-2.0)
    first = bootstrap_median_diff_ci(a, b, seed=3)
    assert first == bootstrap_median_diff_ci(a, b, seed=3)
    assert first[0] <= -2.0 <= first[1]


def test_compare_samples_verdicts() -> None:
    rng = np.random.default_rng(1)
    base = iteration_stats("base", (21.3 + rng.normal(0, 0.1, 30)).tolist())
    faster = iteration_stats("head", (18.6 + rng.normal(0, 0.1, 30)).tolist())
    same = iteration_stats("head", (21.3 + rng.normal(0, 0.1, 30)).tolist())
    result = compare_samples(base, faster)
    assert result.verdict == "faster" and result.p_value < 1e-6
    assert result.ci_low_ms < result.delta_median_ms < result.ci_high_ms < 0
    assert result.delta_median_pct == pytest.approx(-12.7, abs=1.0)
    assert "Mann-Whitney" in result.method and "bootstrap" in result.method
    assert compare_samples(faster, base).verdict == "slower"
    assert compare_samples(base, same).verdict == "no significant change"
    tiny = compare_samples(iteration_stats("a", [1.0]), iteration_stats("b", [2.0]))
    assert tiny.verdict == "no significant change"


def _exact_reference_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p by enumerating every split of the pooled values (no ties)."""
    pooled, m = a + b, len(a)

    def u_of(base: tuple[float, ...], head: list[float]) -> int:
        return sum(1 for x in base for y in head if y > x)

    observed = u_of(tuple(a), b)
    us = []
    for idx in itertools.combinations(range(len(pooled)), m):
        base = tuple(pooled[i] for i in idx)
        us.append(u_of(base, [pooled[i] for i in range(len(pooled)) if i not in idx]))
    low = sum(u <= observed for u in us) / len(us)
    high = sum(u >= observed for u in us) / len(us)
    return min(1.0, 2 * min(low, high))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1.0, 2, 3], [4.0, 5, 6]),
        ([1.0, 2, 3, 4, 5], [6.0, 7, 8, 9, 10]),
        ([21.3, 21.2, 21.4, 21.1, 21.35], [18.6, 18.5, 18.7, 21.25, 18.65, 19.0]),
        ([5.0, 1.0, 9.0, 3.0], [2.0, 8.0, 4.0, 6.0, 7.0]),
    ],
)
def test_exact_mann_whitney_matches_enumeration(a: list[float], b: list[float]) -> None:
    p, exact = mann_whitney_exact_p(a, b)
    assert exact and p == pytest.approx(_exact_reference_p(a, b))


def test_exact_p_falls_back_with_ties_and_smallest_p_and_samples_needed() -> None:
    assert mann_whitney_exact_p([1.0, 1.0, 2.0], [3.0, 3.0, 4.0])[1] is False
    assert smallest_p(3, 3) == pytest.approx(0.1) and smallest_p(4, 4) == pytest.approx(2 / 70)
    assert samples_needed(3, 3, 0.05) == (4, 5)  # 3 vs 5: 2/56 = 0.036
    assert samples_needed(1, 1, 0.01) == (5, 199)  # 2/C(10, 5) = 0.008; 2/(1 + 199)


def test_relative_shift_interval_covers_the_true_shift_at_small_n() -> None:
    """Lognormal times, true shift +10%: the 95% interval covers it in about 95% of trials at
    n=5 and n=12 (distribution-free: exact for continuous data), and n=3 gives none."""
    rng = np.random.default_rng(9)
    for n in (5, 12):
        covered = 0
        for _ in range(400):
            base = rng.lognormal(3.0, 0.1, n)
            head = 1.10 * rng.lognormal(3.0, 0.1, n)
            shift = relative_shift(base.tolist(), head.tolist())
            assert shift.low is not None and shift.high is not None
            covered += shift.low <= 0.10 <= shift.high
        assert 0.92 <= covered / 400 <= 0.99, (n, covered)
    small = relative_shift([10.0, 11.0, 12.0], [40.0, 44.0, 48.0])
    assert not small.decidable and small.point == pytest.approx(3.0)
    with pytest.raises(ValueError, match="positive"):
        relative_shift([1.0, 0.0], [1.0, 2.0])
