"""Every step timed is what makes the pull-request gate able to fail: two real ``cptrace
profile`` runs of one job (the same command line in two checkouts, the head's step code 4x
slower) with the default profile settings give n >= 20 timed iterations per side, and the gate
(default thresholds) fails the head. A trace that marks no steps (nsys of a job without NVTX
steps) carries them on the group compared."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzers import analyze
from analyzers.compare import compare_reports, default_window
from cptrace.cli import app
from pr_bot.policy import StatusState, Thresholds, TimeOutcome, judge
from runners.bundle import add_trace, finalize_bundle, run_info, trace_entry

SCRIPTS = Path(__file__).resolve().parent / "scripts"
STEP_CODE = """import time

import torch

MS = {ms}


def step() -> float:
    x = torch.randn(32, 32)
    time.sleep(MS / 1000)
    return float((x @ x).sum())
"""


def _profile(checkout: Path, ms: float, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``cptrace profile`` of ``python paced_loop.py --steps 30`` in a checkout of its own."""
    checkout.mkdir()
    shutil.copy(SCRIPTS / "paced_loop.py", checkout / "paced_loop.py")
    (checkout / "paced_step.py").write_text(STEP_CODE.format(ms=ms))
    monkeypatch.chdir(checkout)
    out = checkout / "bundle"
    result = CliRunner().invoke(app, [
        "profile", "--no-nsys", "--torch", "--step-function", "paced_step:step", "--quiet",
        "--out", str(out), "--timeout", "120", "--name", "paced", "--",
        sys.executable, "paced_loop.py", "--steps", "30",
    ])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_four_times_slower_steps_fail_the_gate_with_the_default_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 ms against 80 ms: a loaded machine wakes a sleeping step tens of ms late (a 4 ms step
    # measured 66 ms at a load of 16, the gate then inconclusive); 4x stays 4x above that noise
    base = analyze(_profile(tmp_path / "base", 20.0, monkeypatch))
    head = analyze(_profile(tmp_path / "head", 80.0, monkeypatch))
    report = compare_reports(base, head)
    assert not [c for c in report.comparability if c.refuses_time_verdict], report.comparability
    assert report.iterations is not None
    # 30 calls: 1 warm-up and 4 under the profiler (its warm-up + 3 active) left out.
    assert report.iterations.base.n == report.iterations.head.n == 25
    assert report.iterations.base.source == "timed"
    verdict = judge(report, Thresholds())
    assert verdict.state == StatusState.FAILURE, verdict
    assert verdict.time is not None and verdict.time.outcome == TimeOutcome.REGRESSION


def _nsys_bundle(root: Path, data_dir: Path, samples: list[float]) -> Path:
    """A profile-style bundle: one real nsys export that marks no steps, and the whole job's
    timed steps on a variant without a window (what ``cptrace profile`` writes)."""
    root.mkdir()
    trace = add_trace(root, data_dir / "openworld" / "nsys_plain_cuda.sqlite.gz")
    finalize_bundle(
        root, run=run_info(name=root.name, spec={}, created_at=None),
        traces=[trace_entry(trace, fmt="nsys", rank=0)], workload={},
        variants=[{"name": "profiled", "window": None, "facts": {},
                   "iteration_ms": {"0": samples}}],
        environment={},
    )
    return root


def test_timed_steps_of_a_trace_without_step_marks_are_what_compare_picks(
    tmp_path: Path, data_dir: Path
) -> None:
    samples = [10.0 + 0.01 * i for i in range(25)]
    base = analyze(_nsys_bundle(tmp_path / "base", data_dir, samples))
    head = analyze(_nsys_bundle(tmp_path / "head", data_dir, [4 * x for x in samples]))
    (timed,) = [it for it in base.iterations if it.rank is None]
    assert timed.source == "timed" and timed.n == 25
    assert timed.label == default_window(base)  # the group compare and the gate judge
    report = compare_reports(base, head)
    assert report.iterations is not None and report.iterations.head.n == 25
    assert judge(report, Thresholds()).state == StatusState.FAILURE
