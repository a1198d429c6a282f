"""Policy, baseline choice and the loop's comment, on a real comparison of H200 traces
(demo bundle: stock TE vs the adapter, +68 launches per step, +17% median) and real SQLite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from testkit import DATA_DIR

from analyzers import analyze, compare_reports
from analyzers.bundle import read_bundle
from analyzers.report import ComparisonReport
from pr_bot.comment import CommentContext
from pr_bot.policy import StatusState, Thresholds, judge
from pr_bot.suite_comment import (
    Baseline,
    ComparedSpec,
    FailedSpec,
    UnbaselinedSpec,
    github_state,
    render_suite_comment,
    status_description,
    suite_state,
)
from service.core.config import Settings
from service.github_loop.baseline import choose_baseline, run_tags
from service.main import open_database
from service.storage import runs

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "demo" / "bundles" / "te-2.20.2-adapter-vs-stock-h200x2.tar.gz"


@pytest.fixture(scope="module")
def reports() -> tuple[ComparisonReport, ComparisonReport, Any]:
    with read_bundle(BUNDLE) as bundle:
        report = analyze(bundle.analysis_paths(), manifest=bundle.manifest)
    stock, adapter = "arm:te_stock", "arm:te_adapter"
    slower = compare_reports(report, report, base_window=stock, head_window=adapter)
    faster = compare_reports(report, report, base_window=adapter, head_window=stock)
    return slower, faster, report


def test_policy_needs_the_ci_beyond_the_threshold(reports) -> None:
    slower, faster, _ = reports
    assert slower.iterations is not None and slower.iterations.delta_median_pct > 10
    verdict = judge(slower, Thresholds())
    assert verdict.state == StatusState.FAILURE
    assert verdict.reasons[0].startswith("iteration time +15.9% (median ")
    assert "Mann-Whitney" in verdict.method and "above +5%" in verdict.method
    # Effect below this suite's threshold (and helper times not gated): passes ...
    loose = {"threshold_pct": 50, "helper_floor_ms": 100, "host_floor_ms": 100}
    assert judge(slower, Thresholds(**loose)).state == StatusState.SUCCESS
    # ... unless launches may not grow: counts are exact, +68 per step is real.
    gated = judge(slower, Thresholds(**loose, max_launch_increase=0))
    assert gated.state == StatusState.FAILURE and gated.reasons == [
        "launches per step +68 (the suite allows +0)"
    ]
    # Faster, but the stock arm's metadata helper appears with 8 ms of host time per step: the
    # per-helper rule fails it; the iteration time alone is an improvement.
    faster_verdict = judge(faster, Thresholds(max_launch_increase=0))
    assert faster_verdict.state == StatusState.FAILURE and faster_verdict.reasons == [
        "get_cu_seqlens_on_cp_rank host time 0.000 -> 8.086 ms per step (appeared; the suite "
        "allows +100%)"
    ]
    improved = judge(faster, Thresholds(helper_floor_ms=100, host_floor_ms=100))
    assert improved.state == StatusState.SUCCESS and "below -5%" in improved.notes[0]


def _context() -> CommentContext:
    return CommentContext(suite="h200x2", base_name="#4 ref @ aaaa", head_name="#9 ref @ bbbb",
                          comparison_url="https://c.test/compare/4/9")  # fmt: skip


def test_comment_has_verdict_baseline_helper_deltas_and_findings(reports) -> None:
    slower, _, report = reports
    compared = ComparedSpec(
        spec="adapter", report=slower, verdict=judge(slower, Thresholds(max_launch_increase=0)),
        context=_context(),
        baseline=Baseline(4, "#4 ref @ aaaa", "merge-base", "a" * 40, "main"),
    )  # fmt: skip
    newest = ComparedSpec(
        spec="adapter2", report=slower, verdict=judge(slower, Thresholds(threshold_pct=90)),
        context=_context(), baseline=Baseline(4, "#4 ref", "newest", "c" * 40, "main"),
    )  # fmt: skip
    none = UnbaselinedSpec("fresh", "#10 fresh", "no analysed run on main", list(report.findings))
    failed = FailedSpec("broken", "setup command failed (exited with status 3)",
                        "line\n```\n$ rm -rf /\nerror: no such package")  # fmt: skip
    results = [compared, newest, none, failed]
    body = render_suite_comment("h200x2", "b" * 40, results, Thresholds(max_launch_increase=0))
    title = "<!-- cptrace:suite=h200x2 -->\n### cptrace · h200x2: :boom: a job failed"
    assert body.startswith(title)
    assert "#### `adapter`: :x: regression" in body
    assert "- launches per step +68 (the suite allows +0)" in body
    assert "measured at the merge base `aaaaaaaaaaaa` of `main`" in body
    assert "the newest measured run of `main` (the merge base `cccccccccccc` has not been" in body
    changed = [d for d in slower.helpers if d.status != "unchanged"]
    assert changed and all(f"`{d.helper}`" in body for d in changed)
    assert "Per-helper launch deltas" in body
    kernels = sorted((k for k in slower.kernel_deltas if k.status != "unchanged"),
                     key=lambda k: abs(k.delta_total_ns), reverse=True)  # fmt: skip
    assert kernels and "Top kernel deltas (per step, summed over ranks)" in body
    assert f"`{kernels[0].name}`" in body.replace("\\|", "|")
    assert slower.total_gpu is not None and "Total GPU time (per step, summed over ranks)" in body
    assert slower.account and "Where the step went (per step, mean over ranks)" in body
    top = next(d for d in slower.account if d.label != "(all)" and abs(d.delta_ns) >= 1_000)
    assert f"| {top.part.value} | `{top.label}` |" in body.replace("\\|", "|")
    assert "No baseline: no analysed run on main" in body
    assert all(f.title in body for f in report.findings)
    assert "The job failed: setup command failed (exited with status 3)" in body
    assert "error: no such package" in body and "```\n$ rm" not in body  # fence kept closed
    assert suite_state(results) == StatusState.ERROR
    assert github_state(StatusState.ERROR) == "failure"  # a failed job is red, never "error"
    assert suite_state([none]) == StatusState.NEUTRAL
    assert github_state(StatusState.NEUTRAL) == "success"
    assert status_description([none]) == (
        "no baseline: nothing measured on the base branch to compare with (not judged)"
    )
    assert status_description([compared]).startswith("regression: adapter: iteration time")


def _insert(db, run_id: int, *, branch: str, commit: str, pr: int | None = None,
            gpu: str = "NVIDIA H200", suite: str = "h200x2", spec: str = "adapter",
            status: str = "analysed", entry_key: str | None = None) -> None:  # fmt: skip
    manifest = {
        "run": {
            "repo": "octo/model",
            "suite": suite,
            "spec_name": spec,
            "pr": pr,
            "entry_key": entry_key,
        },
        "environment": {"gpu_models": [gpu], "torch": "2.11.0", "cuda": "13.0"},
    }
    db.write(lambda c: c.execute(
        "INSERT INTO runs (id, name, branch, commit_sha, source, status, manifest_json,"
        " created_at) VALUES (?, 'r', ?, ?, 'upload', ?, ?, '2026-12-01')",
        (run_id, branch, commit, status, json.dumps(manifest)),
    ))  # fmt: skip
    db.write(lambda c: runs.set_manifest_columns(c, run_id=run_id, manifest=manifest))


def test_baseline_is_the_merge_base_run_on_the_same_stack_else_the_newest(tmp_path) -> None:
    db = open_database(Settings(data_dir=tmp_path))
    try:
        _insert(db, 1, branch="main", commit="m1")  # the merge base
        _insert(db, 2, branch="main", commit="m2")  # newer main run
        _insert(db, 3, branch="main", commit="m3", gpu="NVIDIA A100")  # other GPU
        _insert(db, 4, branch="main", commit="m4", pr=8)  # a PR run whose branch says main
        _insert(db, 5, branch="main", commit="m5", spec="other")  # another spec of the suite
        _insert(db, 6, branch="main", commit="m6", status="failed")  # not analysed
        _insert(db, 7, branch="release", commit="r1")  # another branch
        _insert(db, 9, branch="topic", commit="h1", pr=8)  # the head
        head = db.read(lambda c: run_tags(c, 9))
        assert head is not None and head.pr == 8 and head.spec == "adapter"

        def pick(base_ref: str, merge_base: str | None):
            chosen = db.read(lambda c: choose_baseline(c, head, base_ref, merge_base))
            return None if chosen is None else (chosen.run.run_id, chosen.how)

        assert pick("main", "m1") == (1, "merge-base")
        assert pick("main", "unmeasured") == (2, "newest")
        assert pick("main", None) == (2, "newest")
        assert pick("release", None) == (7, "newest")
        assert pick("gh-pages", None) is None
        a100 = db.read(lambda c: run_tags(c, 3))
        assert db.read(lambda c: choose_baseline(c, a100, "main", None)) is None
    finally:
        db.close()


def test_a_command_entry_baseline_needs_the_same_command_and_profile_key(tmp_path) -> None:
    """A command entry's key is its command line + profiler settings: a main run of the same
    entry name with another key (the command or the schedule changed) measures something
    else; a spec run (no key) never stands in for a command run either."""
    db = open_database(Settings(data_dir=tmp_path))
    try:
        _insert(db, 1, branch="main", commit="m1", spec="train", entry_key="cmd-aaaa")
        _insert(db, 2, branch="main", commit="m2", spec="train", entry_key="cmd-bbbb")
        _insert(db, 3, branch="main", commit="m3", spec="train")  # a spec named train
        _insert(db, 9, branch="topic", commit="h1", pr=8, spec="train", entry_key="cmd-aaaa")
        _insert(db, 10, branch="topic", commit="h2", pr=8, spec="train", entry_key="cmd-cccc")
        _insert(db, 11, branch="topic", commit="h3", pr=8, spec="train")

        def pick(head_id: int) -> int | None:
            head = db.read(lambda c: run_tags(c, head_id))
            assert head is not None
            chosen = db.read(lambda c: choose_baseline(c, head, "main", None))
            return None if chosen is None else chosen.run.run_id

        assert db.read(lambda c: run_tags(c, 9)).entry_key == "cmd-aaaa"  # type: ignore[union-attr]
        assert pick(9) == 1  # the newest main run is 3 and 2, but they are other entries
        assert pick(10) is None
        assert pick(11) == 3
    finally:
        db.close()


CPU_BUNDLE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"


def test_a_cpu_comparison_shows_host_time_per_helper_and_names_the_growth() -> None:
    """A real gloo run (no GPU activity), arm fixed vs broken: no launch rows exist, so the
    comment's per-helper figures are host calls and self host ms per step; the broken arm's
    helpers appear, and the headline names the helper whose host time grew most."""
    from pr_bot.deltas import host_only, host_rows_for, host_time_rows

    with read_bundle(CPU_BUNDLE) as bundle:
        report = analyze(bundle.analysis_paths(), manifest=bundle.manifest)
    fixed, broken = "arm:fixed", "arm:broken"
    compared = compare_reports(report, report, base_window=fixed, head_window=broken)
    assert host_only(report, report) and not [d for d in compared.helpers if d.delta_launches]
    rows = {r.helper: r for r in host_time_rows(report, report, fixed, broken)}
    recompute, zero_fill = rows["get_cu_seqlens_on_cp_rank"], rows["cp_attention.grad_zero_fill"]
    assert (recompute.status, recompute.base_calls, recompute.head_calls) == ("appeared", 0, 32)
    assert (zero_fill.status, zero_fill.base_calls, zero_fill.head_calls) == ("appeared", 0, 4)
    assert recompute.head_ms > 0 and zero_fill.head_ms > 0
    same = [r for r in rows.values() if r.status == "same calls"]
    assert same and all(r.base_calls == r.head_calls > 0 for r in same)
    ordered = host_time_rows(report, report, fixed, broken)
    assert host_rows_for(report, report, compared) == ordered  # what the publisher passes
    assert [r.delta_ms for r in ordered] == sorted((r.delta_ms for r in ordered), reverse=True)

    result = ComparedSpec(
        spec="smoke", report=compared,
        verdict=judge(compared, Thresholds(fail_on_new_findings="info")), context=_context(),
        baseline=Baseline(4, "#4 ref", "merge-base", "a" * 40, "main"), host_rows=ordered,
    )  # fmt: skip
    body = render_suite_comment("cpu", "b" * 40, [result], Thresholds())
    assert "No GPU activity in one of the runs" in body and "Per-helper launch deltas" not in body
    assert "Per-helper host time (host ranges of each helper's outermost calls" in body
    assert f"- Host time grew most in `{ordered[0].helper}`: +" in body
    line = next(x for x in body.splitlines() if x.startswith("| `get_cu_seqlens_on_cp_rank` |"))
    assert line.startswith("| `get_cu_seqlens_on_cp_rank` | 0.0 | 32.0 | +32.0 | 0.000 |")
    assert line.endswith("| appeared |")
