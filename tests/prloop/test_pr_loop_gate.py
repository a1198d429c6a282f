"""What the publisher compares with what, on a real SQLite file: a spec run with variants is
judged arm by arm with its ABBA-timed iterations (one verdict per arm, the suite the worst),
and the base side's iteration times are pooled from the base branch's last K runs.

The reports are the real CPU gloo bundle's (arms fixed and broken, four timed iterations each);
each main run's timed iterations are scaled by a run-to-run factor, the head's broken arm by 4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analyzers import analyze
from analyzers.bundle import read_bundle
from analyzers.report import REPORT_SCHEMA_VERSION, AnalysisReport
from analyzers.stats import iteration_stats
from pr_bot.github import GitHubConfig
from pr_bot.labels import run_label
from pr_bot.policy import StatusState, Thresholds
from pr_bot.suite_comment import ComparedSpec, render_suite_comment, suite_state
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.github_loop.publisher import Publisher
from service.main import open_database
from service.storage import runs

CPU_BUNDLE = Path(__file__).resolve().parents[1] / "data" / "cpu-gloo" / "cpu_smoke.tar.gz"


@pytest.fixture(scope="module")
def cpu_report() -> AnalysisReport:
    with read_bundle(CPU_BUNDLE) as bundle:
        return analyze(bundle.analysis_paths(), manifest=bundle.manifest)


def _scaled(report: AnalysisReport, factors: dict[str, float]) -> AnalysisReport:
    """A copy whose timed iterations of each named arm are multiplied by its factor."""
    copy = report.model_copy(deep=True)
    copy.iterations = [
        iteration_stats(it.label, [factors[it.label] * x for x in it.samples_ms], rank=it.rank,
                        source=it.source) if it.label in factors else it
        for it in report.iterations
    ]  # fmt: skip
    return copy


def _insert(db: Any, run_id: int, report: AnalysisReport, *, branch: str, pr: int | None) -> None:
    manifest = {
        "run": {"repo": "octo/model", "suite": "smoke", "spec_name": "loop-smoke", "pr": pr},
        "environment": {"gpu_models": [], "torch": "2.11.0"},
    }

    def write(conn: Any) -> None:
        conn.execute(
            "INSERT INTO runs (id, name, branch, commit_sha, source, status, manifest_json,"
            " created_at) VALUES (?, 'loop-smoke', ?, ?, 'upload', 'analysed', ?, '2026-12-01')",
            (run_id, branch, f"{run_id:02d}" * 20, json.dumps(manifest)),
        )
        runs.set_manifest_columns(conn, run_id=run_id, manifest=manifest)
        runs.record_report(
            conn,
            run_id=run_id,
            schema_version=REPORT_SCHEMA_VERSION,
            catalog_version=report.catalog_version,
            report_json=report.model_dump_json(),
            duration_s=0.0,
            metrics=[],
        )

    db.write(write)


def test_a_variant_spec_is_judged_per_arm_against_pooled_history(
    tmp_path: Path, cpu_report: AnalysisReport
) -> None:
    arms = ("arm:fixed", "arm:broken")
    assert all(g in cpu_report.groups for g in arms)
    db = open_database(Settings(data_dir=tmp_path))
    try:
        for run_id in range(1, 7):  # main's history: six runs, 1% apart
            noise = 1.0 + 0.01 * (run_id - 3)
            _insert(db, run_id, _scaled(cpu_report, dict.fromkeys(arms, noise)), branch="main",
                    pr=None)  # fmt: skip
        _insert(db, 9, _scaled(cpu_report, {"arm:broken": 4.0}), branch="feature", pr=7)
        publisher = Publisher(db, LoopSettings(), GitHubConfig(token="t"))
        job = {"name": "loop-smoke", "status": "completed", "run_id": 9, "reason": None,
               "log_tail": ""}  # fmt: skip
        batch = {"base_ref": "main", "head_ref": "feature", "suite": "smoke"}
        results = publisher._result(job, batch, Thresholds(), merge_base=None)
    finally:
        db.close()
    assert [type(r) for r in results] == [ComparedSpec, ComparedSpec]
    by_arm = {r.arm: r for r in results if isinstance(r, ComparedSpec)}
    assert set(by_arm) == set(arms)
    fixed, broken = by_arm["arm:fixed"], by_arm["arm:broken"]
    assert broken.verdict.state == StatusState.FAILURE
    assert broken.verdict.time is not None and broken.verdict.time.n_base == 20  # 5 runs x 4
    assert broken.verdict.time.n_head == 4 and broken.verdict.time.low_pct is not None
    assert fixed.verdict.state != StatusState.FAILURE, fixed.verdict
    pooled = ", ".join(run_label(i, "loop-smoke", f"{i:02d}" * 20) for i in (6, 5, 4, 3, 2))
    assert fixed.history == [
        f"base iteration times pooled from the last 5 runs of main (n=20: {pooled})"
    ]
    assert suite_state(results) == StatusState.FAILURE
    body = render_suite_comment("smoke", "b" * 40, results, Thresholds())
    assert "#### `loop-smoke` `arm:broken`: :x: regression" in body
    assert "#### `loop-smoke` `arm:fixed`: " in body and "1 spec(s)" in body
    assert "- base iteration times pooled from the last 5 runs of main (n=20" in body
