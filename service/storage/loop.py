"""Every statement on the pull-request loop's batches (``pr_batches``) and the pages' reads of
its jobs, on either backend.

The loop queues a batch (one commit and suite) with its jobs (``service.github_loop.planner``;
the jobs' own statements are ``service.storage.jobs``), supersedes the older batches of a pull
request, and marks a batch published, superseded or failed (``service.github_loop.publisher``).
The pages read batches, pull requests and jobs only through here and ``service.store``; every
list is paged in SQL and never reads a large column (specs, logs, checkouts).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from service.auth import now_iso
from service.storage import schema
from service.storage.engine import Conn, execute, insert_for

_b = schema.pr_batches
_j = schema.jobs

_JOB_COLUMNS = (
    "id", "name", "status", "gpus", "attempts", "max_attempts", "runner", "lease_expires_at",
    "run_id", "reason", "created_at", "updated_at", "batch_id", "repo", "pr_number",
    "head_sha", "suite",
)  # fmt: skip
_BATCH_COLUMNS = (
    "id", "repo", "pr_number", "head_sha", "head_ref", "base_sha", "base_ref", "suite",
    "status", "state", "reason", "comment_url", "created_at", "updated_at", "published_at",
)  # fmt: skip
MARKABLE = frozenset({"status", "state", "reason", "comment_url", "published_at"})
"""The columns the publisher sets on a batch (``mark_batch``)."""


def _batches() -> sa.Select[Any]:
    """The listed columns of a batch, with how many jobs it has."""
    jobs = (
        sa.select(sa.func.count())
        .select_from(_j)
        .where(_j.c.batch_id == _b.c.id)
        .scalar_subquery()
        .label("jobs")
    )
    return sa.select(*(_b.c[name] for name in _BATCH_COLUMNS), jobs)


def _equal(table: sa.Table, equal: dict[str, Any]) -> list[sa.ColumnElement[bool]]:
    """``column = value`` for the filters that are set (None: not filtered)."""
    return [table.c[column] == value for column, value in equal.items() if value is not None]


def list_batches(
    conn: Conn, *, repo: str | None, pr: int | None, limit: int, offset: int
) -> list[dict[str, Any]]:
    """Batches (one commit and suite each), newest first."""
    where = _equal(_b, {"repo": repo, "pr_number": pr})
    query = _batches().where(*where).order_by(_b.c.id.desc()).limit(limit).offset(offset)
    return execute(conn, query).rows


def count_batches(conn: Conn, *, repo: str | None, pr: int | None) -> int:
    where = _equal(_b, {"repo": repo, "pr_number": pr})
    return int(execute(conn, sa.select(sa.func.count()).select_from(_b).where(*where)).scalar())


def get_batch(conn: Conn, *, batch_id: int) -> dict[str, Any] | None:
    return execute(conn, _batches().where(_b.c.id == batch_id)).first()


def list_pulls(conn: Conn, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """One row per (repository, pull request): its newest batch's head and branches."""
    g = (
        sa.select(
            _b.c.repo,
            _b.c.pr_number,
            sa.func.max(_b.c.id).label("newest"),
            sa.func.count().label("batches"),
            sa.func.max(sa.func.coalesce(_b.c.updated_at, _b.c.created_at)).label("updated_at"),
        )
        .where(_b.c.pr_number.is_not(None))
        .group_by(_b.c.repo, _b.c.pr_number)
        .subquery("g")
    )
    c = _b.c
    query = (
        sa.select(c.repo, c.pr_number, c.head_sha, c.head_ref, c.base_ref, g.c.batches,
                  g.c.updated_at)
        .select_from(g.join(_b, _b.c.id == g.c.newest))
        .order_by(g.c.newest.desc())
        .limit(limit)
        .offset(offset)
    )  # fmt: skip
    return execute(conn, query).rows


def head_batches(conn: Conn, *, repo: str, pr: int, head_sha: str) -> list[dict[str, Any]]:
    """The batches (one per suite) of one pull request's head commit."""
    c = _b.c
    query = _batches().where(c.repo == repo, c.pr_number == pr, c.head_sha == head_sha)
    return execute(conn, query.order_by(c.suite)).rows


def list_jobs(
    conn: Conn,
    *,
    batch_id: int | None,
    status: str | None,
    limit: int,
    offset: int,
) -> list[dict[str, Any]]:
    """Jobs, newest first (a batch's: in queue order)."""
    where = _equal(_j, {"batch_id": batch_id, "status": status})
    order = _j.c.id if batch_id is not None else _j.c.id.desc()
    query = sa.select(*(_j.c[name] for name in _JOB_COLUMNS)).where(*where).order_by(order)
    return execute(conn, query.limit(limit).offset(offset)).rows


def get_job(conn: Conn, *, job_id: int) -> dict[str, Any] | None:
    """One job with its spec and log tail."""
    columns = [_j.c[name] for name in (*_JOB_COLUMNS, "spec_json", "log_tail")]
    return execute(conn, sa.select(*columns).where(_j.c.id == job_id)).first()


# -- the loop's writes --------------------------------------------------------------------------
def insert_batch(
    conn: Conn,
    *,
    repo: str,
    pr_number: int | None,
    head_sha: str,
    head_ref: str | None,
    base_sha: str | None,
    base_ref: str | None,
    suite: str,
    config_json: str,
    reason: str | None,
    delivery_id: str | None,
) -> int | None:
    """Queue a batch; None when this commit and suite has one already (it is left alone)."""
    now = now_iso()
    insert = insert_for(conn, _b).values(
        repo=repo, pr_number=pr_number, head_sha=head_sha, head_ref=head_ref, base_sha=base_sha,
        base_ref=base_ref, suite=suite, config_json=config_json, status="queued", reason=reason,
        delivery_id=delivery_id, created_at=now, updated_at=now,
    )  # fmt: skip
    found = execute(conn, insert.on_conflict_do_nothing().returning(_b.c.id)).scalar()
    return None if found is None else int(found)


def supersede_older(conn: Conn, *, repo: str, pr: int, suite: str, newest: int) -> int:
    """Mark the pull request's queued batches of ``suite`` older than ``newest`` superseded and
    take their not yet claimed jobs out of the queue. Returns the jobs taken out."""
    c = _b.c
    older = execute(
        conn,
        sa.select(c.id).where(
            c.repo == repo, c.pr_number == pr, c.suite == suite, c.id < newest,
            c.status == "queued",
        ),
    ).rows  # fmt: skip
    ids = [int(r["id"]) for r in older]
    if not ids:
        return 0
    now = now_iso()
    execute(conn, sa.update(_b).where(c.id.in_(ids)).values(status="superseded", updated_at=now))
    taken = execute(
        conn,
        sa.update(_j)
        .where(_j.c.status == "queued", _j.c.batch_id.in_(ids))
        .values(status="failed", reason="superseded by a newer push", updated_at=now),
    )
    return taken.rowcount


def mark_batch(conn: Conn, batch_id: int, **fields: Any) -> None:
    """Set a batch's ``MARKABLE`` columns (and its ``updated_at``)."""
    unknown = set(fields) - MARKABLE
    if unknown:
        raise ValueError(f"not a batch column the loop sets: {sorted(unknown)}")
    update = sa.update(_b).where(_b.c.id == batch_id)
    execute(conn, update.values(**fields, updated_at=now_iso()))


# -- the loop's reads of whole batches ----------------------------------------------------------
def batch_row(conn: Conn, batch_id: int) -> dict[str, Any] | None:
    """Every column of one batch (its configuration included), or None."""
    return execute(conn, sa.select(_b).where(_b.c.id == batch_id)).first()


def queued_batch_rows(conn: Conn) -> list[dict[str, Any]]:
    """Every column of the batches not yet published, in queue order."""
    return execute(conn, sa.select(_b).where(_b.c.status == "queued").order_by(_b.c.id)).rows


def has_newer_batch(conn: Conn, *, repo: str, pr: int, suite: str, batch_id: int) -> bool:
    """Whether the pull request has a batch of ``suite`` newer than ``batch_id``."""
    c = _b.c
    query = sa.select(c.id).where(c.repo == repo, c.pr_number == pr, c.suite == suite)
    return execute(conn, query.where(c.id > batch_id).limit(1)).first() is not None


def commit_batch_ids(conn: Conn, *, repo: str, head_sha: str, pr: int | None) -> list[int]:
    """The batches (one per suite) of a commit of a pull request (``pr``) or a pushed branch
    (None), in queue order."""
    c = _b.c
    query = sa.select(c.id).where(
        c.repo == repo, c.head_sha == head_sha, sa.func.coalesce(c.pr_number, 0) == (pr or 0)
    )
    return [int(r["id"]) for r in execute(conn, query.order_by(c.id)).rows]


def batch_job_outcomes(conn: Conn, batch_id: int) -> list[dict[str, Any]]:
    """``id, name, status, run_id, reason`` of a batch's jobs, in queue order."""
    c = _j.c
    query = sa.select(c.id, c.name, c.status, c.run_id, c.reason).where(c.batch_id == batch_id)
    return execute(conn, query.order_by(c.id)).rows
