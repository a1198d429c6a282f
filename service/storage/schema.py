"""The tables, defined once (SQLAlchemy Core): what PostgreSQL is created from and what the
SQLite migration chain must arrive at.

SQLite databases reach this schema through ``service.storage.migrations`` (databases made by
any earlier version migrate forward in place); a PostgreSQL database is created from it
directly (``create_postgres_schema``: there are no PostgreSQL databases of older versions to
carry forward). ``tests/service/test_storage_schema.py`` checks that the SQLite chain and this
definition name the same tables, columns, keys and nullability, so the two cannot drift.

Types are the ones the code reads back on both engines: times are ISO-8601 text (the run list
filters on their date prefix), lease times are epoch seconds as doubles.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    text,
)

metadata = MetaData()


def _id() -> Column[int]:
    # Never reused (SQLite AUTOINCREMENT, a PostgreSQL identity): a deleted run's link in a PR
    # comment must not point at a newer run.
    return Column("id", BigInteger().with_variant(Integer, "sqlite"), Identity(), primary_key=True)


blobs = Table(
    "blobs",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("size", BigInteger),
    Column("created_at", Text),
)

runs = Table(
    "runs",
    metadata,
    _id(),
    Column("name", Text, nullable=False),
    Column("branch", Text),
    Column("commit_sha", Text),
    Column("host", Text),
    Column("source", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("progress", Text),
    Column("error", Text),
    Column("config_key", Text),
    Column("manifest_json", Text),
    Column("spec_json", Text),
    Column("job_id", BigInteger),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text),
    Column("job_failed", Integer, nullable=False, server_default=text("0")),
    Column("implementation", Text),
    Column("implementations", Text),
    Column("workload_json", Text),
    Column("repo", Text),
    Column("pr", BigInteger),
    Column("suite", Text),
    Column("spec_name", Text),
    Column("entry_key", Text),
    Column("analysis_s", Double),
    Column("caveat", Text),
    Index("idx_runs_created_at", "created_at"),
    Index("idx_runs_branch", "branch"),
    Index("idx_runs_config_key", "config_key"),
    Index("idx_runs_status", "status"),
    Index("runs_verdict", "status", "job_failed"),
    Index("runs_loop_tags", "repo", "suite", "spec_name", "branch"),
    Index("runs_implementation", "implementation"),
)

run_files = Table(
    "run_files",
    metadata,
    _id(),
    Column("run_id", ForeignKey("runs.id"), nullable=False),
    Column("role", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("format", Text),
    Column("rank", BigInteger),
    Column("sha256", ForeignKey("blobs.sha256"), nullable=False),
    Column("size", BigInteger),
    Index("idx_run_files_run_id", "run_id"),
    Index("idx_run_files_sha256", "sha256"),
)

uploads = Table(
    "uploads",
    metadata,
    Column("key", Text, primary_key=True),
    Column("run_id", ForeignKey("runs.id")),
    Column("created_at", Text),
    Column("token_id", BigInteger),
)

analysis_tasks = Table(
    "analysis_tasks",
    metadata,
    _id(),
    Column("run_id", ForeignKey("runs.id"), nullable=False),
    Column("status", Text, nullable=False),
    Column("attempts", Integer),
    Column("worker", Text),
    Column("lease_expires_at", Double),
    Column("error", Text),
    Column("created_at", Text),
    Column("updated_at", Text),
    # A run's analysis is one task (kind "run"), or, for a run of several trace files, a merge
    # task (its parent) waiting on one "rank" task per file (``service.storage.tasks``).
    Column("kind", Text, nullable=False, server_default=text("'run'")),
    Column("parent_id", BigInteger),
    Column("part", Integer),
    Column("part_sha256", Text),
    Index("idx_analysis_tasks_status_id", "status", "id"),
    Index("idx_analysis_tasks_run_id", "run_id"),
    Index("idx_analysis_tasks_parent_id", "parent_id"),
)

reports = Table(
    "reports",
    metadata,
    Column("run_id", ForeignKey("runs.id"), primary_key=True),
    Column("schema_version", Integer),
    Column("catalog_version", Text),
    Column("report_json", Text),
    Column("duration_s", Double),
    Column("created_at", Text),
)

run_metrics = Table(
    "run_metrics",
    metadata,
    Column("run_id", ForeignKey("runs.id"), primary_key=True),
    Column("metric", Text, primary_key=True),
    Column("label", Text, primary_key=True),
    Column("value", Double),
    Index("idx_run_metrics_metric", "metric"),
)

run_pages = Table(
    "run_pages",
    metadata,
    Column("run_id", ForeignKey("runs.id"), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("stamp", Text, nullable=False),
    Column("page_json", Text, nullable=False),
)

run_page_parts = Table(
    "run_page_parts",
    metadata,
    Column("run_id", ForeignKey("runs.id"), primary_key=True),
    Column("version", Text, nullable=False),
    Column("summary_stamp", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("charts", Integer, nullable=False),
    Column("html", Text, nullable=False),
    Column("page_json", Text, nullable=False),
)
"""The run page as built from its page summary (``web.page_parts``): the report's HTML and its
``.json`` twin's fields, written when the worker stores the report so a view only reads them.
``summary_stamp`` is the ``run_pages`` stamp they were built from (a re-analysed run's parts
are stale until rebuilt); ``version`` fingerprints the code that built them."""

comparisons = Table(
    "comparisons",
    metadata,
    _id(),
    Column("base_run_id", ForeignKey("runs.id")),
    Column("head_run_id", ForeignKey("runs.id")),
    Column("base_window", Text),
    Column("head_window", Text),
    Column("verdict", Text),
    Column("summary", Text),
    Column("report_json", Text),
    Column("created_at", Text),
    Index(
        "idx_comparisons_base_run_id_head_run_id_base_window_head_window",
        "base_run_id",
        "head_run_id",
        "base_window",
        "head_window",
        unique=True,
    ),
)

jobs = Table(
    "jobs",
    metadata,
    _id(),
    Column("name", Text),
    Column("spec_json", Text, nullable=False),
    Column("spec_yaml", Text),
    Column("gpus", Integer),
    Column("status", Text, nullable=False),
    Column("attempts", Integer),
    Column("max_attempts", Integer),
    Column("runner", Text),
    Column("lease_expires_at", Double),
    Column("run_id", BigInteger),
    Column("reason", Text),
    Column("log_tail", Text),
    Column("created_at", Text),
    Column("updated_at", Text),
    Column("claim_token_id", BigInteger),
    Column("batch_id", BigInteger),
    Column("repo", Text),
    Column("pr_number", BigInteger),
    Column("head_sha", Text),
    Column("base_sha", Text),
    Column("suite", Text),
    Column("checkout_json", Text),
    Column("releases", Integer, nullable=False, server_default=text("0")),
    Index("idx_jobs_status_id", "status", "id"),
    Index("idx_jobs_batch_id", "batch_id"),
)

runners = Table(
    "runners",
    metadata,
    Column("name", Text, primary_key=True),
    Column("gpus", Integer),
    Column("first_seen", Text),
    Column("last_seen", Text),
    Column("current_job_id", BigInteger),
)

tokens = Table(
    "tokens",
    metadata,
    _id(),
    Column("name", Text),
    Column("role", Text, nullable=False),
    Column("token_hash", Text, nullable=False),
    Column("created_at", Text),
    Column("runner", Text),
    Column("repo", Text),
    Index("idx_tokens_token_hash", "token_hash", unique=True),
)

worker_heartbeats = Table(
    "worker_heartbeats",
    metadata,
    Column("name", Text, primary_key=True),
    Column("started_at", Text),
    Column("beat_at", Double),
    Column("state", Text),
)

github_deliveries = Table(
    "github_deliveries",
    metadata,
    Column("delivery_id", Text, primary_key=True),
    Column("event", Text, nullable=False),
    Column("action", Text),
    Column("received_at", Text, nullable=False),
    Column("outcome", Text),
)

pr_batches = Table(
    "pr_batches",
    metadata,
    _id(),
    Column("repo", Text, nullable=False),
    Column("pr_number", BigInteger),
    Column("head_sha", Text, nullable=False),
    Column("head_ref", Text),
    Column("base_sha", Text),
    Column("base_ref", Text),
    Column("suite", Text, nullable=False),
    Column("config_json", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("state", Text),
    Column("reason", Text),
    Column("comment_url", Text),
    Column("delivery_id", Text),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text),
    Column("published_at", Text),
    Index("idx_pr_batches_status_id", "status", "id"),
)
# One batch per (repository, pull request or pushed branch, head, suite); a push has no PR
# number, and NULLs are distinct in a unique index, hence the coalesce.
Index(
    "pr_batches_key",
    pr_batches.c.repo,
    func.coalesce(pr_batches.c.pr_number, 0),
    pr_batches.c.head_sha,
    pr_batches.c.suite,
    unique=True,
)

POSTGRES_SCHEMA_VERSIONS = ("pg001_baseline", "pg002_rank_tasks", "pg003_run_page_parts")
"""The PostgreSQL schema versions this code knows, in order: a new database is created from the
definition above at the last one; one made at an earlier one runs the changes after it."""

schema_versions = Table(
    "cptrace_schema_versions",
    metadata,
    Column("name", Text, primary_key=True),
    Column("applied_at", Text, nullable=False),
)

APPLICATION_TABLES = tuple(t for t in metadata.sorted_tables if t is not schema_versions)

_POSTGRES_CHANGES: dict[str, tuple[str, ...]] = {
    "pg002_rank_tasks": (
        "ALTER TABLE analysis_tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'run'",
        "ALTER TABLE analysis_tasks ADD COLUMN parent_id BIGINT",
        "ALTER TABLE analysis_tasks ADD COLUMN part INTEGER",
        "ALTER TABLE analysis_tasks ADD COLUMN part_sha256 TEXT",
        "CREATE INDEX idx_analysis_tasks_parent_id ON analysis_tasks (parent_id)",
    ),
    "pg003_run_page_parts": (
        "CREATE TABLE run_page_parts (run_id BIGINT NOT NULL REFERENCES runs (id),"
        " version TEXT NOT NULL, summary_stamp TEXT NOT NULL, created_at TEXT NOT NULL,"
        " charts INTEGER NOT NULL, html TEXT NOT NULL, page_json TEXT NOT NULL,"
        " PRIMARY KEY (run_id))",
    ),
}
"""What each version after the baseline changes in a database made before it (SQLite's
counterpart: ``service.storage.migrations``)."""


def create_postgres_schema(conn: Connection) -> list[str]:
    """Bring a PostgreSQL database to the last schema version (the caller's transaction): an
    empty one is created from the definition, one of an earlier version gets the changes after
    it. Returns the versions applied.

    A transaction-scoped advisory lock serialises processes starting together on one database
    (two API processes and a worker), so exactly one creates the schema and the others see it.
    """
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('cptrace schema'))"))
    schema_versions.create(conn, checkfirst=True)
    done = set(
        conn.execute(schema_versions.select().with_only_columns(schema_versions.c.name)).scalars()
    )
    if not done:
        for table in APPLICATION_TABLES:
            table.create(conn, checkfirst=False)
        pending = list(POSTGRES_SCHEMA_VERSIONS)
    else:
        pending = [v for v in POSTGRES_SCHEMA_VERSIONS if v not in done]
        for version in pending:
            for statement in _POSTGRES_CHANGES[version]:
                conn.execute(text(statement))
    for version in pending:
        conn.execute(
            schema_versions.insert().values(name=version, applied_at=func.now().cast(Text))
        )
    return pending
