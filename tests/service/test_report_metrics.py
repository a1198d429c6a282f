"""Run-level iteration metrics come from timed iterations only, never from profiled steps."""

from __future__ import annotations

from pathlib import Path

from testkit import DATA_DIR

from analyzers import analyze
from service.analysis import report_metrics

DATA = DATA_DIR / "te-2.20.2-h200x2"
DEMO = Path(__file__).resolve().parents[2] / "demo" / "bundles"


def test_profiled_only_run_has_no_iteration_median() -> None:
    # The 3-arm Kineto pair alone: only profiled windows, whose durations include the
    # profiler's overhead, so no iteration time may be reported for the run list or trends.
    report = analyze(sorted(DATA.glob("kineto_3arms_rank*.json.gz")), step_pattern="arm:.*")
    assert report.iterations and all(s.source == "profiled" for s in report.iterations)
    assert not [m for m in report_metrics(report) if m[0] == "iteration_median_ms"]


def test_timed_run_reports_its_timed_median() -> None:
    report = analyze(DEMO / "te-2.20.2-reference-3arms-h200x2.tar.gz")
    metrics = {(m, label): v for m, label, v in report_metrics(report)}
    timed = {
        s.label: s.median_ms for s in report.iterations if s.source == "timed" and s.rank is None
    }
    assert timed, "the demo bundle carries 50 timed iterations per arm"
    for label, median in timed.items():
        assert metrics[("iteration_median_ms", label)] == median
    assert ("iteration_median_ms", "") in metrics
