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
    mann_whitney_u,
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
