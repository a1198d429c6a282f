"""The run page is built when the worker stores the report, and a view only reads what it
stored (issue 24, "Measured": first views of run pages).

A real bundle uploaded through the real API and analysed by the real worker with the hook the
composition root hands it (``cptrace.worker``: ``web.page_parts.store_built``); the stored
``run_page_parts`` row, the HTML page and its ``.json`` twin are compared (no fake store). With
the stored page summary and the report both made unreadable a view still shows the same page,
so it builds nothing. Last, a real ``cptrace serve`` (uvicorn and its supervised worker): the
served worker builds the page too, and the twin served over HTTP is the stored one.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from stored_runs import assert_analysed, drain_worker, upload_bundles

from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings
from service.page_summary import PAGE_SUMMARY_VERSION, RunPageSummary
from service.storage import runs
from tests.service.service_server import Server, wait_for
from web import data, page_parts

BUNDLE = (
    Path(__file__).resolve().parents[2] / "demo" / "bundles"
    / "allgather-bundled-dcs-vs-nlb-h200x2.tar.gz"
)  # fmt: skip
PARTS = "SELECT version, summary_stamp, charts, html, page_json, created_at FROM run_page_parts"


@dataclass
class Stored:
    client: TestClient
    db_path: Path
    run_id: int
    admin: dict[str, str]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("built"), ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    admin = app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, {"run": BUNDLE})
        drain_worker(settings, on_stored=page_parts.store_built)
        assert_analysed(client, ids)
        yield Stored(client, settings.db_path, ids["run"], {"Authorization": f"Bearer {admin}"})


def _sql(db_path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(sql, params).fetchall()


def _parts(db_path: Path, run_id: int) -> tuple[Any, ...] | None:
    found = _sql(db_path, f"{PARTS} WHERE run_id = ?", (run_id,))
    return found[0] if found else None


def _stamp(stored: Stored) -> str:
    ((stamp,),) = _sql(stored.db_path, "SELECT stamp FROM run_pages WHERE run_id = ?",
                       (stored.run_id,))  # fmt: skip
    return str(stamp)


def test_the_worker_stores_the_page_the_views_show(stored: Stored) -> None:
    row = _parts(stored.db_path, stored.run_id)
    assert row is not None, "the worker's hook stored no page"
    version, summary_stamp, charts, html, page_json, _ = row
    assert version == page_parts.VERSION and summary_stamp == _stamp(stored)
    page = stored.client.get(f"/runs/{stored.run_id}").text
    assert html in page and charts == page.count('class="chart"') > 0
    assert '<script src="/static/plotly.min.js" defer>' in page
    twin = stored.client.get(f"/runs/{stored.run_id}.json")
    assert twin.status_code == 200 and twin.headers["content-type"] == "application/json"
    body = twin.json()
    for field, value in json.loads(page_json).items():  # the report's fields as stored
        assert body[field] == value, field
    assert body["run"]["id"] == stored.run_id and body["run"]["status"] == "analysed"
    assert body["verdict"] == body["run"]["verdict"]
    assert set(body) == set(data.RunPage.model_fields) - {"figure_json"}
    data.RunPage.model_validate(body)  # the twin is the documented model
    # what the worker stored is what the code builds from the stored summary
    ((summary_text,),) = _sql(stored.db_path, "SELECT page_json FROM run_pages WHERE run_id = ?",
                              (stored.run_id,))  # fmt: skip
    built = page_parts.build(stored.run_id, RunPageSummary.model_validate_json(summary_text))
    assert (built.charts, built.html, built.page_json) == (charts, html, page_json)


def test_a_view_reads_only_the_built_page(stored: Stored) -> None:
    before = stored.client.get(f"/runs/{stored.run_id}").text
    twin = stored.client.get(f"/runs/{stored.run_id}.json").json()
    run = (stored.run_id,)
    ((summary,),) = _sql(stored.db_path, "SELECT page_json FROM run_pages WHERE run_id = ?", run)
    ((report,),) = _sql(stored.db_path, "SELECT report_json FROM reports WHERE run_id = ?", run)
    # neither can be parsed now (the summary's stamp and version stay: still the current one)
    _sql(stored.db_path, "UPDATE run_pages SET page_json = 'unreadable' WHERE run_id = ?", run)
    _sql(stored.db_path, "UPDATE reports SET report_json = 'unreadable' WHERE run_id = ?", run)
    try:
        page = stored.client.get(f"/runs/{stored.run_id}")
        assert page.status_code == 200 and page.text == before
        assert stored.client.get(f"/runs/{stored.run_id}.json").json() == twin
    finally:
        _sql(stored.db_path, "UPDATE run_pages SET page_json = ? WHERE run_id = ?", (summary, *run))
        _sql(stored.db_path, "UPDATE reports SET report_json = ? WHERE run_id = ?", (report, *run))


def test_the_run_row_is_read_at_every_view(stored: Stored) -> None:
    """The built page holds the report's part only: the run's own fields stay live."""
    run = (stored.run_id,)
    _sql(stored.db_path, "UPDATE runs SET progress = 'being re-checked' WHERE id = ?", run)
    try:
        assert "(being re-checked)" in stored.client.get(f"/runs/{stored.run_id}").text
        twin = stored.client.get(f"/runs/{stored.run_id}.json").json()
        assert twin["run"]["progress"] == "being re-checked"
    finally:
        _sql(stored.db_path, "UPDATE runs SET progress = NULL WHERE id = ?", run)


def test_a_stale_page_is_built_again_once(stored: Stored) -> None:
    """Built by other code (a deploy changed a template), or from a summary replaced since (a
    re-analysis): the next view builds it from the stored summary and stores it; the one after
    only reads it."""
    run = (stored.run_id,)
    _sql(stored.db_path, "UPDATE run_page_parts SET version = 'old', html = '<p>stale page</p>'"
         " WHERE run_id = ?", run)  # fmt: skip
    assert "stale page" not in stored.client.get(f"/runs/{stored.run_id}").text
    rebuilt = _parts(stored.db_path, stored.run_id)
    assert rebuilt is not None and rebuilt[0] == page_parts.VERSION
    stored.client.get(f"/runs/{stored.run_id}")
    assert _parts(stored.db_path, stored.run_id) == rebuilt  # built once

    ((text,),) = _sql(stored.db_path, "SELECT page_json FROM run_pages WHERE run_id = ?", run)
    changed = RunPageSummary.model_validate_json(text)
    changed.notes.append("changed by a re-analysis")
    with sqlite3.connect(stored.db_path) as conn:
        runs.store_page(conn, run_id=stored.run_id, version=PAGE_SUMMARY_VERSION,
                        page_json=changed.model_dump_json())  # fmt: skip
    assert "changed by a re-analysis" in stored.client.get(f"/runs/{stored.run_id}").text
    again = _parts(stored.db_path, stored.run_id)
    assert again is not None and again[1] == _stamp(stored) != rebuilt[1]
    twin = stored.client.get(f"/runs/{stored.run_id}.json").json()
    assert twin["report"]["notes"][-1] == "changed by a re-analysis"


def test_a_run_analysed_before_gets_its_page_built_at_its_first_view(stored: Stored) -> None:
    """No page summary and no built page (analysed before either existed): the first view
    builds both from the report and stores both; the next view only reads them."""
    run = (stored.run_id,)
    _sql(stored.db_path, "DELETE FROM run_page_parts WHERE run_id = ?", run)
    _sql(stored.db_path, "DELETE FROM run_pages WHERE run_id = ?", run)
    first = stored.client.get(f"/runs/{stored.run_id}")
    assert first.status_code == 200 and 'class="chart"' in first.text
    built = _parts(stored.db_path, stored.run_id)
    assert built is not None and built[0] == page_parts.VERSION and built[1] == _stamp(stored)
    assert built[3] in first.text
    assert stored.client.get(f"/runs/{stored.run_id}").text == first.text
    assert _parts(stored.db_path, stored.run_id) == built


def test_deleting_the_run_deletes_its_built_page(stored: Stored) -> None:
    assert _parts(stored.db_path, stored.run_id) is not None
    resp = stored.client.delete(f"/api/v1/runs/{stored.run_id}", headers=stored.admin)
    assert resp.status_code == 200, resp.text
    assert _parts(stored.db_path, stored.run_id) is None
    assert stored.client.get(f"/runs/{stored.run_id}").status_code == 404
    assert stored.client.get(f"/runs/{stored.run_id}.json").status_code == 404


@pytest.mark.slow
def test_the_served_worker_builds_the_page(tmp_path: Path) -> None:
    server = Server(tmp_path).start()
    try:
        resp = httpx.post(
            f"{server.url}/api/v1/uploads/bundles", headers=server.headers, timeout=60,
            files={"bundle": (BUNDLE.name, BUNDLE.read_bytes())},
        )  # fmt: skip
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        db_path = tmp_path / "cptrace.db"
        row = wait_for(lambda: _parts(db_path, run_id), 120, "the served worker's built page")
        version, _, charts, html, page_json, _ = row
        assert version == page_parts.VERSION and charts > 0
        assert html in httpx.get(f"{server.url}/runs/{run_id}", timeout=30).text
        twin = httpx.get(f"{server.url}/runs/{run_id}.json", timeout=30).json()
        assert {k: twin[k] for k in json.loads(page_json)} == json.loads(page_json)
    finally:
        server.stop()
