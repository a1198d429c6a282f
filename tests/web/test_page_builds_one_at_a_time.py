"""HTML pages are built one at a time, and the API's reads do not wait for them (issue 24,
"Measured": mixed API p99).

A real app over a real SQLite store holding a real trace's report: while one page build holds
``web.routes.PAGE_BUILDS``, a second page waits for it, and an API read of the same run is
answered meanwhile (the reads run on the event loop, the builds in the thread pool).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from testkit import DATA_DIR

from analyzers import analyze
from cptrace.app import create_app
from service.core.config import Settings
from service.page_summary import page_summary
from service.storage import runs
from web import routes

TRACE = DATA_DIR / "openworld" / "kineto_nccl_world1.json.gz"


def test_a_page_waits_for_the_build_in_progress_while_api_reads_go_on(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, ingest_workers=0, run_worker=False))
    report = analyze([TRACE])
    summary = page_summary(report)

    def add_run(conn: sqlite3.Connection) -> int:
        run_id = runs.create_run(conn, name="gate", source="bundle", status="analysed")
        runs.record_report(
            conn, run_id=run_id, schema_version=report.schema_version,
            catalog_version=report.catalog_version, report_json=report.model_dump_json(),
            duration_s=1.0, metrics=[], page=(summary.version, summary.model_dump_json()),
        )  # fmt: skip
        return run_id

    run_id = app.state.db.write_tx(add_run)
    with TestClient(app) as client:
        assert client.get(f"/runs/{run_id}").status_code == 200  # nothing held: served
        answers: list[httpx.Response] = []
        with routes.PAGE_BUILDS:  # a build in progress
            page = threading.Thread(target=lambda: answers.append(client.get(f"/runs/{run_id}")))
            page.start()
            page.join(0.5)
            assert page.is_alive() and not answers  # the page waits for the build
            read = client.get(f"/api/v1/runs/{run_id}")
            assert read.status_code == 200 and read.json()["id"] == run_id
        page.join(10)
        assert not page.is_alive() and answers[0].status_code == 200
        assert "gate" in answers[0].text
