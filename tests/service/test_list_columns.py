"""Lists never read a large column: manifests, specs, reports, logs (issue 24 item 7).

An 8 MB manifest string cut the run list from 614 to 50 req/s (json_extract over every listed
manifest) and a 58 MB expanded job spec slowed the job list to 10 req/s. The facts lists read are
columns stored at insert; SQLite's authorizer here refuses any read of a large column, so a list
query that touches one fails instead of passing slowly. Runs stored before the columns (migration
m041) get them filled once.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlite_utils

from service import jobs
from service.storage import loop, runs
from service.storage.migrations import apply_migrations, migrations
from service.storage.runs import Metric, RunFilters

LARGE = {
    "runs": {"manifest_json", "spec_json"},
    "reports": {"report_json"},
    "run_pages": {"page_json"},
    "comparisons": {"report_json"},
    "jobs": {"spec_json", "spec_yaml", "log_tail", "checkout_json"},
}
MANIFEST = {
    "workload": {"implementation": "te", "cp_size": 2},
    "variants": [{"name": "a", "workload": {"implementation": "te-adapter"}}, {"name": "b"}],
    "run": {"repo": "octo/model", "pr": 7, "suite": "smoke", "spec_name": "ref", "entry_key": "k"},
    "padding": "x" * 1_000_000,
}


def _refuse_large_columns(action: int, table: str | None, column: str | None, *_: object) -> int:
    if action == sqlite3.SQLITE_READ and column in LARGE.get(table or "", set()):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = _connect(tmp_path / "cptrace.db")
    apply_migrations(conn)
    run_id = runs.create_run(
        conn, name="big", source="upload", status="analysed", branch="main", config_key="cfg",
        manifest=MANIFEST, spec={"pad": "y" * 100_000},
    )  # fmt: skip
    runs.record_report(
        conn, run_id=run_id, schema_version=1, catalog_version="v", report_json="{}" * 100_000,
        duration_s=2.5, metrics=[(Metric.FINDINGS, "", 1.0), (Metric.ITERATION_MEDIAN_MS, "", 9.0)],
        page=(1, "{}"),
    )  # fmt: skip
    runs.store_comparison(
        conn, base_run_id=run_id, head_run_id=run_id, base_window="a", head_window="b",
        verdict="same", summary="s", report_json="{}",
    )  # fmt: skip
    jobs.submit_job(conn, spec={"pad": "z" * 100_000}, spec_yaml=None, name="j", gpus=0,
                    max_attempts=1)  # fmt: skip
    conn.set_authorizer(_refuse_large_columns)
    yield conn
    conn.close()


def test_the_authorizer_refuses_a_large_column(conn: sqlite3.Connection) -> None:
    with pytest.raises(sqlite3.DatabaseError, match="prohibited"):
        conn.execute("SELECT manifest_json FROM runs").fetchall()


def test_run_list_filters_sorts_and_counts_read_no_manifest(conn: sqlite3.Connection) -> None:
    every = RunFilters(
        status="analysed", branch="main", config_key="cfg", implementation="te",
        verdict="findings", repo="octo/model", pr=7, suite="smoke", commit="", name="bi",
    )  # fmt: skip
    for sort in runs.SORT_KEYS:
        (row,) = runs.list_runs(conn, filters=every, limit=5, offset=0, sort=sort)
        assert (row["implementation"], row["repo"], row["pr"], row["suite"], row["spec_name"]) == (
            "te", "octo/model", 7, "smoke", "ref")  # fmt: skip
        assert row["verdict"] == "findings" and row["median_ms"] == 9.0
    assert runs.count_runs(conn, filters=every) == 1
    assert runs.distinct_values(conn)["implementation"] == ["te"]
    (point,) = runs.metric_history(
        conn, config_key="cfg", metric=Metric.ITERATION_MEDIAN_MS, label=None, limit=10
    )
    assert point["implementation"] == "te, te-adapter"  # the variants' implementations
    assert json.loads(point["workload_json"]) == MANIFEST["workload"]
    assert runs.analysis_facts(conn, run_id=1)["duration_s"] == 2.5


def test_comparison_and_job_lists_read_no_report_spec_or_log(conn: sqlite3.Connection) -> None:
    (comparison,) = runs.list_comparisons(conn, run_id=1, limit=5, offset=0)
    assert comparison["verdict"] == "same"
    (job,) = loop.list_jobs(conn, batch_id=None, status=None, limit=5, offset=0)
    assert job["name"] == "j"
    assert loop.list_batches(conn, repo=None, pr=None, limit=5, offset=0) == []


def test_runs_stored_before_the_columns_get_them_filled_once(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "old.db")
    migrations.apply(sqlite_utils.Database(conn), stop_before="m041_run_summary_columns")
    conn.execute(
        "INSERT INTO runs (name, source, status, config_key, manifest_json, created_at)"
        " VALUES ('old', 'upload', 'analysed', 'cfg', ?, '2026-12-01')",
        (json.dumps(MANIFEST),),
    )
    conn.execute(
        "INSERT INTO reports (run_id, schema_version, catalog_version, report_json, duration_s,"
        " created_at) VALUES (1, 1, 'v', '{}', 4.0, '2026-12-01')"
    )
    conn.execute(
        "INSERT INTO runs (name, source, status, created_at) VALUES"
        " ('no-manifest', 'api', 'queued', '2026-12-01')"
    )
    assert apply_migrations(conn)[0] == "m041_run_summary_columns"
    conn.set_authorizer(_refuse_large_columns)
    old, bare = runs.list_runs(conn, filters=RunFilters(), limit=5, offset=0, sort="name")
    assert (old["name"], old["implementation"], old["repo"], old["pr"]) == (
        "old", "te", "octo/model", 7)  # fmt: skip
    assert (bare["name"], bare["implementation"], bare["repo"]) == ("no-manifest", None, None)
    assert runs.analysis_facts(conn, run_id=1)["duration_s"] == 4.0
    assert runs.count_runs(conn, filters=RunFilters(suite="smoke", pr=7)) == 1
