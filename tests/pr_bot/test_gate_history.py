"""Baselines from history: the last K runs pooled, after the newest change point, which is
reported. Runs are built from real timed iterations (the H200 demo bundle's fixed arm), each
run a different slice of them, a level shift scaling a run's samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyzers.bundle import read_bundle
from pr_bot.history import HistoryRun, pool_history
from pr_bot.policy import Thresholds, TimeOutcome, time_gate

BUNDLE = (
    Path(__file__).resolve().parents[2]
    / "demo"
    / "bundles"
    / ("bundled-fixed-vs-broken-h200x2.tar.gz")
)


@pytest.fixture(scope="module")
def fixed_ms() -> list[float]:
    with read_bundle(BUNDLE) as bundle:
        (arm,) = [v for v in bundle.manifest.variants if v.name == "fixed"]
    return [float(x) for x in np.array(list(arm.iteration_ms.values())).max(axis=0)]


def _runs(samples: list[float], levels: list[float]) -> list[HistoryRun]:
    """One run per level (oldest first in ``levels``), newest first as history is read."""
    rng = np.random.default_rng(4)
    runs = [
        HistoryRun(i + 1, f"#{i + 1}", (level * rng.choice(samples, 10, replace=False)).tolist())
        for i, level in enumerate(levels)
    ]
    return runs[::-1]


def test_the_last_k_runs_are_pooled(fixed_ms: list[float]) -> None:
    history = _runs(fixed_ms, [1.0] * 8)
    pooled = pool_history(history, 5, min_shift_pct=5, base_ref="main")
    assert pooled.run_ids == [8, 7, 6, 5, 4] and len(pooled.samples) == 50
    assert pooled.lines == [
        "base iteration times pooled from the last 5 runs of main (n=50: #8, #7, #6, #5, #4)"
    ]
    single = pool_history(history[:1], 5, min_shift_pct=5, base_ref="main")
    assert single.run_ids == [8] and single.lines == []


def test_a_step_in_history_is_reported_and_not_pooled_across(fixed_ms: list[float]) -> None:
    """main got 30% slower at run #7: pooling the last 8 would mix both levels."""
    history = _runs(fixed_ms, [1.0] * 6 + [1.3] * 6)
    pooled = pool_history(history, 8, min_shift_pct=5, base_ref="main")
    assert pooled.run_ids == [12, 11, 10, 9, 8, 7]
    change, pooling = pooled.lines
    assert change.startswith("main history (12 runs): change point at #7: median ")
    assert "(+3" in change  # +30% or so
    assert pooling.startswith("base iteration times pooled from the last 6 runs of main after "
                              "the newest change point")  # fmt: skip
    # A head at the new level is not a regression against the pooled base ...
    head = (1.3 * np.asarray(fixed_ms[:20])).tolist()
    assert time_gate(pooled.samples, head, Thresholds()).outcome == TimeOutcome.WITHIN
    # ... while the old level would have called it one.
    old = [x for run in history[6:] for x in run.samples]
    assert time_gate(old, head, Thresholds()).outcome == TimeOutcome.REGRESSION
