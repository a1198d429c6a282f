"""Every step timed is what makes the pull-request gate able to fail: two real ``cptrace
profile`` runs of one job with the default profile settings, the head's steps 4x slower, give
n >= 20 timed iterations per side, and the gate (default thresholds) fails the head."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzers import analyze
from analyzers.compare import compare_reports
from cptrace.cli import app
from pr_bot.policy import StatusState, Thresholds, TimeOutcome, judge

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _profile(out: Path, ms: float) -> Path:
    result = CliRunner().invoke(app, [
        "profile", "--no-nsys", "--torch", "--step-function", "paced_step:step", "--quiet",
        "--out", str(out), "--timeout", "120", "--",
        sys.executable, str(SCRIPTS / "paced_loop.py"), "--steps", "30", "--ms", str(ms),
    ])
    assert result.exit_code == 0, result.output
    return out


def test_four_times_slower_steps_fail_the_gate_with_the_default_settings(
    tmp_path: Path,
) -> None:
    base = analyze(_profile(tmp_path / "base", 4.0))
    head = analyze(_profile(tmp_path / "head", 16.0))
    report = compare_reports(base, head)
    assert report.iterations is not None
    # 30 calls: 1 warm-up and 4 under the profiler (its warm-up + 3 active) left out.
    assert report.iterations.base.n == report.iterations.head.n == 25
    assert report.iterations.base.source == "timed"
    verdict = judge(report, Thresholds())
    assert verdict.state == StatusState.FAILURE, verdict
    assert verdict.time is not None and verdict.time.outcome == TimeOutcome.REGRESSION
