"""A comparison with one sample on a side has no interval and says so (issue 25, defect 7):
"n=1: no interval", never a zero-width 95% CI. The real one-GPU NCCL Kineto trace, one of its
profiled steps against another, through the CLI."""

from __future__ import annotations

import json

from testkit import DATA_DIR
from typer.testing import CliRunner

from analyzers.report import IterationStats
from analyzers.stats import compare_samples, iteration_stats
from cptrace.cli import app

TRACE = DATA_DIR / "openworld" / "kineto_nccl_world1.json.gz"


def _stats(samples: list[float]) -> IterationStats:
    return iteration_stats("x", samples)


def test_one_sample_side_has_no_interval() -> None:
    result = compare_samples(_stats([2.0]), _stats([1.0, 1.1, 0.9]))
    assert not result.interval and "n=1: no interval" in result.method
    assert compare_samples(_stats([2.0, 2.1]), _stats([1.0, 1.1])).interval


def test_cli_says_no_interval_for_one_step_per_side() -> None:
    args = ["compare", "--base", str(TRACE), "--step-pattern", r"^ProfilerStep#\d+$"]
    windows = ["--base-window", "ProfilerStep", "--head-window", "ProfilerStep"]
    full = CliRunner().invoke(app, [*args, *windows, "--json"])
    assert full.exit_code == 0, full.output
    steps = json.loads(full.output)["iterations"]["base"]["n"]
    assert steps >= 2  # the trace's profiled steps
    one = ["--step-pattern", r"^ProfilerStep#2$", *windows]
    result = CliRunner().invoke(app, ["compare", "--base", str(TRACE), *one])
    assert result.exit_code == 0, result.output
    assert "n=1: no interval" in result.output and "CI [" not in result.output
