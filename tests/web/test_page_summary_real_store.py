"""The run page reads the page summary the worker stored, never the whole report.

A real bundle uploaded through the real API and analysed by the real worker; the page, its
``.json`` twin and the stored rows are compared (no fake store). With the stored report made
unreadable the page still shows everything, so a view cannot be parsing it; a run stored before
the summary existed (no ``run_pages`` row, or an older version) gets it built once.
"""

from __future__ import annotations

import html
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from stored_runs import assert_analysed, drain_worker, upload_bundles

from analyzers.report import AnalysisReport
from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings
from service.page_summary import PAGE_SUMMARY_VERSION, RunPageSummary, page_summary
from service.storage import runs
from web import figures

BUNDLE = (
    Path(__file__).resolve().parents[2] / "demo" / "bundles"
    / "allgather-bundled-dcs-vs-nlb-h200x2.tar.gz"
)  # fmt: skip


@dataclass
class Stored:
    client: TestClient
    db_path: Path
    run_id: int
    admin: dict[str, str]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("pages"), ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    admin = app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, {"run": BUNDLE})
        drain_worker(settings)
        assert_analysed(client, ids)
        yield Stored(client, settings.db_path, ids["run"], {"Authorization": f"Bearer {admin}"})


def _sql(stored: Stored, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(stored.db_path) as conn:
        return conn.execute(sql, params).fetchall()


def _page_row(stored: Stored) -> tuple[int, str, str] | None:
    found = _sql(
        stored, "SELECT version, page_json, created_at FROM run_pages WHERE run_id = ?",
        (stored.run_id,),
    )  # fmt: skip
    return found[0] if found else None


def _report(stored: Stored) -> AnalysisReport:
    resp = stored.client.get(f"/api/v1/runs/{stored.run_id}/analysis/result")
    assert resp.status_code == 200, resp.text
    return AnalysisReport.model_validate(resp.json())


def _figure(page: str, name: str) -> dict[str, Any]:
    block = re.search(
        rf'<script type="application/json" id="fig-{name}">(.*?)</script>', page, flags=re.S
    )
    assert block, f"no figure {name} on the page"
    figure: dict[str, Any] = json.loads(html.unescape(block.group(1)))
    return figure


def test_the_worker_stores_the_summary_the_page_shows(stored: Stored) -> None:
    row = _page_row(stored)
    assert row is not None and row[0] == PAGE_SUMMARY_VERSION
    report = _report(stored)
    summary = RunPageSummary.model_validate_json(row[1])
    assert summary == page_summary(report)
    assert len(row[1]) < len(report.model_dump_json()) / 2  # what the view parses
    twin = stored.client.get(f"/runs/{stored.run_id}.json").json()
    assert twin["report"] == json.loads(row[1])  # the twin is what the worker wrote
    assert twin["run"]["report"] is None
    assert sorted(f["rule"] for f in twin["findings"]) == sorted(f.rule for f in report.findings)
    # every drawn timeline is the full report's, drawn from the stored columns
    page = stored.client.get(f"/runs/{stored.run_id}").text
    timelines = [t for t in [report.timeline, *report.other_timelines] if t and t.events]
    assert timelines and len(twin["timelines"]) == len(timelines)
    for (name, group), timeline in zip(twin["timelines"], timelines, strict=True):
        assert group == timeline.window
        assert _figure(page, name) == json.loads(json.dumps(figures.timeline_figure(timeline)))
    kernels = [k for k in report.kernels if k.window == "whole trace" and k.rank is None]
    assert twin["report"]["kernels_total"] == len(kernels) > 0
    assert max(kernels, key=lambda k: k.total_ns).name in html.unescape(page)


def test_a_page_view_never_reads_the_stored_report(stored: Stored) -> None:
    before = stored.client.get(f"/runs/{stored.run_id}").text
    twin = stored.client.get(f"/runs/{stored.run_id}.json").json()
    (saved,) = _sql(stored, "SELECT report_json FROM reports WHERE run_id = ?", (stored.run_id,))
    _sql(stored, "UPDATE reports SET report_json = 'unreadable' WHERE run_id = ?", (stored.run_id,))
    try:
        page = stored.client.get(f"/runs/{stored.run_id}")
        assert page.status_code == 200 and page.text == before
        assert stored.client.get(f"/runs/{stored.run_id}.json").json() == twin
    finally:
        _sql(stored, "UPDATE reports SET report_json = ? WHERE run_id = ?",
             (saved[0], stored.run_id))  # fmt: skip


def test_a_run_stored_before_the_summary_gets_it_built_once(stored: Stored) -> None:
    row = _page_row(stored)
    assert row is not None
    before = stored.client.get(f"/runs/{stored.run_id}").text
    stale_rows = (
        "DELETE FROM run_pages WHERE run_id = ?",  # a run analysed before m040
        "UPDATE run_pages SET version = 0, page_json = '{}' WHERE run_id = ?",  # older version
        # this version, unreadable: a timeline column pointing past its strings (written as
        # every write is, with a new stamp)
        "UPDATE run_pages SET stamp = 'edited', page_json = '{\"timelines\": [{\"window\": \"w\","
        " \"limit\": 1,"
        " \"dropped\": 0, \"rank\": [0], \"stream\": [0], \"start_ns\": [0],"
        " \"end_ns\": [1], \"name\": [7], \"helper\": [7], \"category\": [7]}]}'"
        " WHERE run_id = ?",
    )
    for stale in stale_rows:
        _sql(stored, stale, (stored.run_id,))
        assert stored.client.get(f"/runs/{stored.run_id}").text == before
        rebuilt = _page_row(stored)
        assert rebuilt is not None and rebuilt[:2] == row[:2]
        assert stored.client.get(f"/runs/{stored.run_id}").text == before
        assert _page_row(stored) == rebuilt  # built once: the next view only reads it


def test_a_new_summary_shows_at_once(stored: Stored) -> None:
    """Views keep the newest summaries parsed and their figures built, keyed by the stored
    row's stamp: a re-analysis (a new row) shows at its next view."""
    row = _page_row(stored)
    assert row is not None
    assert "changed by a re-analysis" not in stored.client.get(f"/runs/{stored.run_id}").text
    changed = RunPageSummary.model_validate_json(row[1])
    changed.notes.append("changed by a re-analysis")
    with sqlite3.connect(stored.db_path) as conn:
        runs.store_page(conn, run_id=stored.run_id, version=PAGE_SUMMARY_VERSION,
                        page_json=changed.model_dump_json())  # fmt: skip
    assert "changed by a re-analysis" in stored.client.get(f"/runs/{stored.run_id}").text
    twin = stored.client.get(f"/runs/{stored.run_id}.json").json()
    assert twin["report"]["notes"][-1] == "changed by a re-analysis"


def test_deleting_the_run_deletes_its_page_summary(stored: Stored) -> None:
    assert _page_row(stored) is not None
    resp = stored.client.delete(f"/api/v1/runs/{stored.run_id}", headers=stored.admin)
    assert resp.status_code == 200, resp.text
    assert _page_row(stored) is None
    assert stored.client.get(f"/runs/{stored.run_id}").status_code == 404
