"""Versioned schema changes, applied in order by sqlite-utils ``Migrations``.

Each ``mNNN`` function runs in its own transaction together with the record that it ran, so a
crash mid-migration leaves the previous schema intact. Never edit an applied migration; add the
next number.
"""

from __future__ import annotations

import json
import sqlite3

import sqlite_utils
from sqlite_utils.migrations import Migrations

migrations = Migrations("cptrace")


@migrations()
def m001_initial(db: sqlite_utils.Database) -> None:
    """Runs, their files, blobs, uploads, analyses, comparisons, jobs, runners, tokens."""
    db.table("blobs").create({"sha256": str, "size": int, "created_at": str}, pk="sha256")
    # AUTOINCREMENT: a deleted run's id is never handed out again, so links in PR comments and
    # dashboards cannot silently point at a different run.
    db.execute(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, branch TEXT,"
        " commit_sha TEXT, host TEXT, source TEXT NOT NULL, status TEXT NOT NULL, progress TEXT,"
        " error TEXT, config_key TEXT, manifest_json TEXT, spec_json TEXT, job_id INTEGER,"
        " created_at TEXT NOT NULL, updated_at TEXT)"
    )
    db.table("runs").create_index(["created_at"])
    db.table("runs").create_index(["branch"])
    db.table("runs").create_index(["config_key"])
    db.table("runs").create_index(["status"])
    db.table("run_files").create(
        {
            "id": int,
            "run_id": int,
            "role": str,
            "name": str,
            "format": str,
            "rank": int,
            "sha256": str,
            "size": int,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("sha256", "blobs", "sha256")],
        not_null={"run_id", "role", "name", "sha256"},
    )
    db.table("run_files").create_index(["run_id"])
    db.table("run_files").create_index(["sha256"])
    # Idempotency: the sha256 of an uploaded body (plus its target) -> the run it created.
    db.table("uploads").create(
        {"key": str, "run_id": int, "created_at": str},
        pk="key",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("analysis_tasks").create(
        {
            "id": int,
            "run_id": int,
            "status": str,
            "attempts": int,
            "worker": str,
            "lease_expires_at": float,
            "error": str,
            "created_at": str,
            "updated_at": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
        not_null={"run_id", "status"},
    )
    db.table("analysis_tasks").create_index(["status", "id"])
    db.table("analysis_tasks").create_index(["run_id"])
    db.table("reports").create(
        {
            "run_id": int,
            "schema_version": int,
            "catalog_version": str,
            "report_json": str,
            "duration_s": float,
            "created_at": str,
        },
        pk="run_id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("run_metrics").create(
        {"run_id": int, "metric": str, "label": str, "value": float},
        pk=("run_id", "metric", "label"),
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("run_metrics").create_index(["metric"])
    db.execute(
        "CREATE TABLE comparisons (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " base_run_id INTEGER REFERENCES runs(id), head_run_id INTEGER REFERENCES runs(id),"
        " base_window TEXT, head_window TEXT, verdict TEXT, summary TEXT, report_json TEXT,"
        " created_at TEXT)"
    )
    db.table("comparisons").create_index(
        ["base_run_id", "head_run_id", "base_window", "head_window"], unique=True
    )
    db.execute(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT,"
        " spec_json TEXT NOT NULL, spec_yaml TEXT, gpus INTEGER, status TEXT NOT NULL,"
        " attempts INTEGER, max_attempts INTEGER, runner TEXT, lease_expires_at FLOAT,"
        " run_id INTEGER, reason TEXT, log_tail TEXT, created_at TEXT, updated_at TEXT)"
    )
    db.table("jobs").create_index(["status", "id"])
    db.table("runners").create(
        {"name": str, "gpus": int, "first_seen": str, "last_seen": str, "current_job_id": int},
        pk="name",
    )
    db.table("tokens").create(
        {"id": int, "name": str, "role": str, "token_hash": str, "created_at": str},
        pk="id",
        not_null={"role", "token_hash"},
    )
    db.table("tokens").create_index(["token_hash"], unique=True)


@migrations()
def m010_job_ownership(db: sqlite_utils.Database) -> None:
    """Bind runner tokens to a runner identity, and jobs to the token that claimed them, so a
    runner token acts only on its own jobs (admins act on any)."""
    db.execute("ALTER TABLE tokens ADD COLUMN runner TEXT")
    db.execute("ALTER TABLE jobs ADD COLUMN claim_token_id INTEGER")


@migrations()
def m011_worker_heartbeats(db: sqlite_utils.Database) -> None:
    """Analysis workers record that they are alive; ``/health`` reads the freshest beat."""
    db.table("worker_heartbeats").create(
        {"name": str, "started_at": str, "beat_at": float, "state": str}, pk="name"
    )


@migrations()
def m020_github_loop(db: sqlite_utils.Database) -> None:
    """The automated pull-request loop: webhook deliveries, PR batches, job checkout fields.

    ``github_deliveries`` makes a replayed delivery id a no-op. A batch is one (repository,
    pull request or pushed branch, head SHA, suite): its jobs run the suite's specs, and once
    they all ended the worker publishes one comment and one commit status for it. The jobs'
    new columns say what to check out and how the run is tagged (``checkout_json``: clone URL,
    SHA, setup command).
    """
    db.execute(
        "CREATE TABLE github_deliveries (delivery_id TEXT PRIMARY KEY, event TEXT NOT NULL,"
        " action TEXT, received_at TEXT NOT NULL, outcome TEXT)"
    )
    db.execute(
        "CREATE TABLE pr_batches (id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL,"
        " pr_number INTEGER, head_sha TEXT NOT NULL, head_ref TEXT, base_sha TEXT,"
        " base_ref TEXT, suite TEXT NOT NULL, config_json TEXT NOT NULL, status TEXT NOT NULL,"
        " state TEXT, reason TEXT, comment_url TEXT, delivery_id TEXT, created_at TEXT NOT NULL,"
        " updated_at TEXT, published_at TEXT)"
    )
    db.execute(
        "CREATE UNIQUE INDEX pr_batches_key ON pr_batches"
        " (repo, coalesce(pr_number, 0), head_sha, suite)"
    )
    db.table("pr_batches").create_index(["status", "id"])
    for column, kind in (
        ("batch_id", int),
        ("repo", str),
        ("pr_number", int),
        ("head_sha", str),
        ("base_sha", str),
        ("suite", str),
        ("checkout_json", str),
    ):
        db.table("jobs").add_column(column, kind)
    db.table("jobs").create_index(["batch_id"])


@migrations()
def m025_run_job_failed(db: sqlite_utils.Database) -> None:
    """Whether a run's job failed or hung (its manifest has a ``failure`` record), stored, so
    the run list's verdict ("failed", never "clean") reads no manifest JSON."""
    db.execute("ALTER TABLE runs ADD COLUMN job_failed INTEGER NOT NULL DEFAULT 0")
    db.execute(
        "UPDATE runs SET job_failed = 1 WHERE coalesce(json_valid(manifest_json)"
        " AND json_type(manifest_json, '$.failure') = 'object', 0)"
    )
    # The verdict's columns apart from the manifest (a row's later columns sit behind its
    # manifest's overflow pages): counting runs by verdict scans this index, not the table.
    db.execute("CREATE INDEX runs_verdict ON runs (status, job_failed)")


@migrations()
def m030_token_scopes(db: sqlite_utils.Database) -> None:
    """CI tokens are scoped to one repository: the only one they may queue batches for. An
    upload records the token that sent it (a runner completes a job only with its own run);
    a job counts its releases (a claim/release cycle cannot hold it forever)."""
    db.execute("ALTER TABLE tokens ADD COLUMN repo TEXT")
    db.execute("ALTER TABLE uploads ADD COLUMN token_id INTEGER")
    db.execute("ALTER TABLE jobs ADD COLUMN releases INTEGER NOT NULL DEFAULT 0")


@migrations()
def m040_run_pages(db: sqlite_utils.Database) -> None:
    """What the run page shows of a report (``service.page_summary``), stored beside it so a
    page view never parses the whole report. Runs analysed before this have none: their first
    view builds it from the report once and stores it."""
    # stamp: new at every write (what a reader's cache of the parsed summary is keyed by);
    # page_json last: the columns before it are read without walking its overflow pages
    db.execute(
        "CREATE TABLE run_pages (run_id INTEGER PRIMARY KEY REFERENCES runs(id),"
        " version INTEGER NOT NULL, created_at TEXT NOT NULL, stamp TEXT NOT NULL,"
        " page_json TEXT NOT NULL)"
    )


@migrations()
def m041_run_summary_columns(db: sqlite_utils.Database) -> None:
    """The manifest facts lists, filters, the history and the loop read, as columns stored at
    insert (``service.storage.runs.manifest_columns``), so no read runs json_extract over a
    manifest; and the analysis duration, so a run's detail reads no report row (its duration
    sits behind the report's overflow pages). Older runs are filled here, once."""
    from service.storage.runs import set_manifest_columns

    for column, kind in (
        ("implementation", "TEXT"), ("implementations", "TEXT"), ("workload_json", "TEXT"),
        ("repo", "TEXT"), ("pr", "INTEGER"), ("suite", "TEXT"), ("spec_name", "TEXT"),
        ("entry_key", "TEXT"), ("analysis_s", "REAL"), ("caveat", "TEXT"),
    ):  # fmt: skip
        db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
    conn = db.conn
    found = conn.execute("SELECT id, manifest_json FROM runs WHERE manifest_json IS NOT NULL")
    for run_id, text in found.fetchall():
        try:
            manifest = json.loads(text)
        except ValueError:
            continue  # never stored by this service (it stores what it parsed)
        set_manifest_columns(conn, run_id=run_id, manifest=manifest)
    conn.execute(
        "UPDATE runs SET analysis_s = (SELECT duration_s FROM reports p WHERE p.run_id = runs.id)"
    )
    db.execute("CREATE INDEX runs_loop_tags ON runs (repo, suite, spec_name, branch)")
    db.execute("CREATE INDEX runs_implementation ON runs (implementation)")


@migrations()
def m042_run_page_parts(db: sqlite_utils.Database) -> None:
    """The run page as built from its summary (``web.page_parts``), stored when the worker
    stores the report, so a first view builds no figure. Runs analysed before this have none:
    their first view builds them once and stores them."""
    db.execute(
        "CREATE TABLE run_page_parts (run_id INTEGER PRIMARY KEY REFERENCES runs(id),"
        " version TEXT NOT NULL, summary_stamp TEXT NOT NULL, created_at TEXT NOT NULL,"
        " charts INTEGER NOT NULL, html TEXT NOT NULL, page_json TEXT NOT NULL)"
    )


@migrations()
def m050_rank_tasks(db: sqlite_utils.Database) -> None:
    """A run of several trace files is analysed as one task per file (kind ``rank``) and a
    merge task waiting on them (their ``parent_id``); a rank task records the part blob it
    wrote (``part_sha256``) for the merge."""
    db.execute("ALTER TABLE analysis_tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'run'")
    db.execute("ALTER TABLE analysis_tasks ADD COLUMN parent_id INTEGER")
    db.execute("ALTER TABLE analysis_tasks ADD COLUMN part INTEGER")
    db.execute("ALTER TABLE analysis_tasks ADD COLUMN part_sha256 TEXT")
    db.execute("CREATE INDEX idx_analysis_tasks_parent_id ON analysis_tasks (parent_id)")


def apply_migrations(conn: sqlite3.Connection) -> list[str]:
    """Apply pending migrations on ``conn``; returns the names applied."""
    db = sqlite_utils.Database(conn)
    pending = [m.name for m in migrations.pending(db)]
    migrations.apply(db)
    return pending
