"""The comparability gate on real runs: what may be compared, and what refuses a time verdict.

Real inputs: the demo bundles captured on 2x H200 (bundled CP attention, TE 2.20.2 stock vs
adapter, all-gather CP), the TE 2.20.2 reference pair (nsys export and Kineto files of one
workload) and an nsys export cut to a time window from that export.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzers import analyze
from analyzers.comparability import comparability
from analyzers.compare import INCONCLUSIVE, compare_reports
from analyzers.pipeline import Analysis
from analyzers.report import AnalysisReport, ComparabilityAspect, ComparisonReport
from cptrace.cli import app
from tests.analyzers.conftest import NSYS_3ARMS

DEMO = Path(__file__).resolve().parents[2] / "demo" / "bundles"
Aspect = ComparabilityAspect


@pytest.fixture(scope="module")
def bundled() -> AnalysisReport:
    return analyze(DEMO / "bundled-fixed-vs-broken-h200x2.tar.gz")


@pytest.fixture(scope="module")
def te_adapter() -> AnalysisReport:
    return analyze(DEMO / "te-2.20.2-adapter-vs-stock-h200x2.tar.gz")


def _aspects(report: ComparisonReport) -> dict[Aspect, bool]:
    return {i.aspect: i.refuses_time_verdict for i in report.comparability}


def test_another_implementation_refuses_the_time_verdict(
    bundled: AnalysisReport, te_adapter: AnalysisReport
) -> None:
    # Both manifests carry the same workload block; te_stock's variant overrides the
    # implementation (TE): unrelated runs that today share one configuration hash.
    report = compare_reports(
        bundled, te_adapter, base_window="arm:fixed", head_window="arm:te_stock"
    )
    [impl] = [i for i in report.comparability if i.aspect == Aspect.IMPLEMENTATION]
    assert (impl.base, impl.head, impl.refuses_time_verdict) == ("bundled", "te", True)
    assert report.iterations is not None and report.iterations.verdict == "faster"
    assert report.verdict == INCONCLUSIVE
    assert "no time verdict: different implementation" in report.summary
    assert impl.message in report.notes and len(report.notes) == len(report.comparability)
    dumped = report.model_dump(mode="json")["comparability"]
    assert {"aspect": "implementation", "refuses_time_verdict": True}.items() <= dumped[0].items()


def test_another_workload_refuses_the_time_verdict(bundled: AnalysisReport) -> None:
    allgather = analyze(DEMO / "allgather-bundled-dcs-vs-nlb-h200x2.tar.gz")
    report = compare_reports(
        bundled, allgather, base_window="arm:fixed", head_window="arm:bundled_dcs"
    )
    [work] = [i for i in report.comparability if i.aspect == Aspect.WORKLOAD]
    assert work.refuses_time_verdict
    assert "cp_comm p2p vs all_gather" in work.message
    assert "metadata value_equal_clone vs same_object" in work.message
    assert Aspect.IMPLEMENTATION not in _aspects(report)  # both bundled
    assert report.verdict == INCONCLUSIVE


def test_the_same_run_twice_has_no_issue(
    bundled: AnalysisReport,
    te_adapter: AnalysisReport,
    nsys_3arms: Analysis,
    kineto_3arms: Analysis,
) -> None:
    for report in (bundled, te_adapter, nsys_3arms.report, kineto_3arms.report):
        for group in report.groups:
            result = compare_reports(report, report, base_window=group, head_window=group)
            assert result.comparability == [] and result.notes == [], (group, result.notes)
    again = analyze(DEMO / "bundled-fixed-vs-broken-h200x2.tar.gz")  # another object
    result = compare_reports(bundled, again, base_window="arm:fixed", head_window="arm:fixed")
    assert result.comparability == [] and result.verdict != INCONCLUSIVE


def test_two_arms_of_one_run_may_differ_in_what_their_variants_declare(
    te_adapter: AnalysisReport,
) -> None:
    # te_stock and te_adapter override workload.implementation: that is the experiment
    report = compare_reports(
        te_adapter, te_adapter, base_window="arm:te_stock", head_window="arm:te_adapter"
    )
    assert report.comparability == [] and report.verdict == "slower"


def test_nsys_and_kineto_of_one_workload_differ_only_in_how_they_were_captured(
    nsys_3arms: Analysis, kineto_3arms: Analysis
) -> None:
    report = compare_reports(
        nsys_3arms.report,
        kineto_3arms.report,
        base_window="nsys_arm:auto_clone",
        head_window="arm:auto_clone",
    )
    aspects = _aspects(report)
    assert set(aspects) == {Aspect.PROFILER, Aspect.STEP_DEFINITION}
    # the iteration times are profiled step durations: each profiler's overhead, no verdict
    assert aspects[Aspect.PROFILER] and not aspects[Aspect.STEP_DEFINITION]
    [profiler] = [i for i in report.comparability if i.aspect == Aspect.PROFILER]
    assert (profiler.base, profiler.head) == ("nsys", "kineto with Python stacks")
    assert report.verdict == INCONCLUSIVE


def test_versions_warn_and_hardware_refuses(bundled: AnalysisReport) -> None:
    env = bundled.environment
    bumped = bundled.model_copy(
        update={"environment": env.model_copy(update={"cudnn": "92000", "torch": "2.12.0"})}
    )
    issues = comparability(bundled, bumped, "arm:fixed", "arm:fixed")
    assert [(i.aspect, i.refuses_time_verdict) for i in issues] == [
        (Aspect.VERSIONS, False),
        (Aspect.VERSIONS, False),
    ]
    assert [i.head for i in issues] == ["torch 2.12.0", "cuDNN 92000"]
    other_gpu = bundled.model_copy(
        update={"environment": env.model_copy(update={"gpu_models": ["NVIDIA B200"]})}
    )
    [gpu] = comparability(bundled, other_gpu, "arm:fixed", "arm:fixed")
    assert (gpu.aspect, gpu.refuses_time_verdict) == (Aspect.GPU_MODEL, True)


def _cut_export(source: Path, target: Path, share: tuple[float, float]) -> tuple[int, int]:
    """Write ``source`` (an nsys SQLite export, gzipped) cut to a time window (from the kernel
    at ``share[0]`` of the kernels to the one at ``share[1]``), as ``nsys export --times``
    leaves it: only events that start inside the window."""
    with gzip.open(source, "rb") as raw, target.open("wb") as out:
        shutil.copyfileobj(raw, out)
    conn = sqlite3.connect(target)
    [(count,)] = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    lo, hi = (
        conn.execute(
            "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1 OFFSET ?",
            (int(s * count),),
        ).fetchone()[0]
        for s in share
    )
    tables = [
        name
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if (name.startswith("CUPTI_ACTIVITY_KIND_") or name == "NVTX_EVENTS")
        and "start" in {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')}
    ]
    for table in tables:
        conn.execute(f'DELETE FROM "{table}" WHERE start < ? OR start > ?', (lo, hi))
    conn.execute(
        "UPDATE META_DATA_EXPORT SET value = ? WHERE name = 'EXPORT_PARAM_TIMES_TO_EXPORT'",
        (f"{lo}-{hi}",),
    )
    conn.commit()
    conn.close()
    return lo, hi


def test_an_export_cut_to_a_time_window_is_not_compared_silently(
    nsys_3arms: Analysis, tmp_path: Path
) -> None:
    lo, hi = _cut_export(NSYS_3ARMS, tmp_path / "cut.sqlite", (0.4, 0.7))
    cut = analyze(tmp_path / "cut.sqlite")
    export, *launches = cut.environment.trace_slices
    assert export == f"nsys export limited to the time range(s) {lo}-{hi}"
    # kernels that started inside the window but were launched before it lost their launch
    assert launches and all("kernels without their launch" in line for line in launches)
    assert nsys_3arms.report.environment.trace_slices == []
    report = compare_reports(nsys_3arms.report, cut)
    [issue] = [i for i in report.comparability if i.aspect == Aspect.TRACE_SLICE]
    assert issue.base == "the whole run" and f"{lo}-{hi}" in issue.head
    assert not issue.refuses_time_verdict and "per-window counts are not comparable" in (
        issue.message
    )
    assert compare_reports(cut, cut).comparability == []  # one run: the same cut


def test_cptrace_compare_prints_and_dumps_the_issues(
    bundled: AnalysisReport, te_adapter: AnalysisReport, tmp_path: Path
) -> None:
    # saved reports stand for their runs (cptrace compare reads them like bundles)
    (tmp_path / "bundled.json").write_text(bundled.model_dump_json())
    (tmp_path / "te.json").write_text(te_adapter.model_dump_json())
    runner = CliRunner()
    args = ["compare", "--base", str(tmp_path / "bundled.json"), "--base-window", "arm:fixed"]
    args += ["--head", str(tmp_path / "te.json"), "--head-window", "arm:te_stock"]
    text = runner.invoke(app, args, catch_exceptions=False, terminal_width=300).output
    first = text.splitlines()[0]
    assert first.startswith("warning: different implementations: base bundled, head te")
    assert first.endswith("[implementation]")
    dumped = json.loads(runner.invoke(app, [*args, "--json"], catch_exceptions=False).output)
    assert dumped["verdict"] == INCONCLUSIVE
    assert [i["aspect"] for i in dumped["comparability"]][:1] == ["implementation"]
