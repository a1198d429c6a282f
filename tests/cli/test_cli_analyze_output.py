"""``cptrace analyze --format csv|json`` with ``--report`` on the real CPU gloo bundle (issue 25).

Sections, formats and the bundle member names are checked against the report the same
bundle gives in process (``analyzers.analyze``).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from testkit import DATA_DIR
from typer.testing import CliRunner

from analyzers.pipeline import analyze
from analyzers.report import AnalysisReport
from cptrace.cli import app

BUNDLE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"


def _run(*args: str) -> str:
    result = CliRunner().invoke(app, ["analyze", str(BUNDLE), *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def report() -> AnalysisReport:
    return analyze(BUNDLE)


def test_sources_are_bundle_members_not_temp_paths(report: AnalysisReport) -> None:
    paths = [s.path for s in report.sources]
    assert paths == ["cpu_smoke.tar.gz:traces/kineto_rank0.json.gz",
                     "cpu_smoke.tar.gz:traces/kineto_rank1.json.gz"]  # fmt: skip
    out = _run("--report", "summary")
    assert all(p in out for p in paths) and "/tmp" not in out


def test_json_report_keeps_only_the_named_sections(report: AnalysisReport) -> None:
    payload: dict[str, Any] = json.loads(_run("--format", "json", "--report", "findings"))
    assert "findings" in payload and "helpers" not in payload and "summary" not in payload
    assert payload["sources"][0]["path"] == report.sources[0].path
    assert [f["rule"] for f in payload["findings"]] == [f.rule for f in report.findings]


def test_csv_has_one_row_per_table_row(report: AnalysisReport) -> None:
    assert report.summary is not None
    rows = list(csv.DictReader(io.StringIO(_run("--format", "csv", "--report", "summary"))))
    tables = [r["table"] for r in rows]
    assert tables.count("do_first") == len(report.summary.do_first) > 0
    assert tables.count("cpu_ops") == len(report.summary.cpu_ops) > 0
    assert {r["section"] for r in rows} == {"summary"}
    first = next(r for r in rows if r["table"] == "cpu_ops")
    assert first["name"] == report.summary.cpu_ops[0].name
    assert int(first["self_ns"]) == report.summary.cpu_ops[0].self_ns
    findings = list(csv.DictReader(io.StringIO(_run("--format", "csv", "--report", "findings"))))
    assert [r["rule"] for r in findings] == [f.rule for f in report.findings]
    assert json.loads(findings[0]["evidence"]) == [
        e.model_dump(mode="json") for e in report.findings[0].evidence
    ]
