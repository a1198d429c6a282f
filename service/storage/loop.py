"""Reads of the pull-request loop's tables (``pr_batches``, ``jobs``) for the pages.

The loop writes these tables from its own modules (``service.github_loop``, ``service.jobs``);
the pages read them only through here and ``service.store``. Every list is paged in SQL.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from service.storage.database import one, rows

JOB_COLUMNS = (
    "j.id, j.name, j.status, j.gpus, j.attempts, j.max_attempts, j.runner, j.lease_expires_at,"
    " j.run_id, j.reason, j.created_at, j.updated_at, j.batch_id, j.repo, j.pr_number,"
    " j.head_sha, j.suite"
)
BATCH_COLUMNS = (
    "b.id, b.repo, b.pr_number, b.head_sha, b.head_ref, b.base_sha, b.base_ref, b.suite,"
    " b.status, b.state, b.reason, b.comment_url, b.created_at, b.updated_at, b.published_at,"
    " (SELECT count(*) FROM jobs j WHERE j.batch_id = b.id) AS jobs"
)


def _where(equal: dict[str, Any]) -> tuple[str, list[Any]]:
    """`` WHERE column = ? AND ...`` for the filters that are set (None: not filtered)."""
    given = {column: value for column, value in equal.items() if value is not None}
    clauses = " AND ".join(f"{column} = ?" for column in given)
    return (f" WHERE {clauses}" if given else ""), list(given.values())


def _batch_where(repo: str | None, pr: int | None) -> tuple[str, list[Any]]:
    return _where({"b.repo": repo, "b.pr_number": pr})


def list_batches(
    conn: sqlite3.Connection, *, repo: str | None, pr: int | None, limit: int, offset: int
) -> list[dict[str, Any]]:
    """Batches (one commit and suite each), newest first."""
    where, params = _batch_where(repo, pr)
    sql = f"SELECT {BATCH_COLUMNS} FROM pr_batches b{where} ORDER BY b.id DESC LIMIT ? OFFSET ?"
    return rows(conn, sql, [*params, limit, offset])


def count_batches(conn: sqlite3.Connection, *, repo: str | None, pr: int | None) -> int:
    where, params = _batch_where(repo, pr)
    return int(conn.execute(f"SELECT count(*) FROM pr_batches b{where}", params).fetchone()[0])


def get_batch(conn: sqlite3.Connection, *, batch_id: int) -> dict[str, Any] | None:
    return one(conn, f"SELECT {BATCH_COLUMNS} FROM pr_batches b WHERE b.id = ?", (batch_id,))


def list_pulls(conn: sqlite3.Connection, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """One row per (repository, pull request): its newest batch's head and branches."""
    sql = (
        "SELECT b.repo, b.pr_number, b.head_sha, b.head_ref, b.base_ref, g.batches,"
        " g.updated_at FROM (SELECT repo, pr_number, max(id) AS newest, count(*) AS batches,"
        " max(coalesce(updated_at, created_at)) AS updated_at FROM pr_batches"
        " WHERE pr_number IS NOT NULL GROUP BY repo, pr_number) g"
        " JOIN pr_batches b ON b.id = g.newest ORDER BY g.newest DESC LIMIT ? OFFSET ?"
    )
    return rows(conn, sql, (limit, offset))


def head_batches(conn: sqlite3.Connection, *, repo: str, pr: int, head_sha: str) -> list[Any]:
    """The batches (one per suite) of one pull request's head commit."""
    sql = (
        f"SELECT {BATCH_COLUMNS} FROM pr_batches b WHERE b.repo = ? AND b.pr_number = ?"
        " AND b.head_sha = ? ORDER BY b.suite"
    )
    return rows(conn, sql, (repo, pr, head_sha))


def list_jobs(
    conn: sqlite3.Connection,
    *,
    batch_id: int | None,
    status: str | None,
    limit: int,
    offset: int,
) -> list[dict[str, Any]]:
    """Jobs, newest first (a batch's: in queue order)."""
    where, params = _where({"j.batch_id": batch_id, "j.status": status})
    order = "j.id" if batch_id is not None else "j.id DESC"
    sql = f"SELECT {JOB_COLUMNS} FROM jobs j{where} ORDER BY {order} LIMIT ? OFFSET ?"
    return rows(conn, sql, [*params, limit, offset])


def get_job(conn: sqlite3.Connection, *, job_id: int) -> dict[str, Any] | None:
    """One job with its spec and log tail."""
    sql = f"SELECT {JOB_COLUMNS}, j.spec_json, j.log_tail FROM jobs j WHERE j.id = ?"
    return one(conn, sql, (job_id,))
