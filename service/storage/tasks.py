"""The analysis task queue's statements, on either backend: enqueue, claim with a lease,
extend it, finish, requeue.

A claim takes the oldest queued task inside :func:`service.storage.engine.transaction`: on
SQLite under ``BEGIN IMMEDIATE`` (one writer at a time, file-wide), on PostgreSQL with
``SELECT ... FOR UPDATE SKIP LOCKED``, so any number of workers on any hosts each lock a
different row and never wait on one another; the conditional ``UPDATE ... WHERE status =
'queued'`` after it is the second guard. A task whose lease ran out (its worker was killed or
hung) is requeued by the next claim, at most ``max_attempts`` times, then fails with the
reason: a killed worker's task runs again exactly once per lost lease.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import sqlalchemy as sa

from service.auth import now_iso
from service.storage import runs, schema
from service.storage.engine import Conn, execute, transaction

_t = schema.analysis_tasks


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this worker holds until its lease runs out."""

    id: int
    run_id: int
    attempt: int


def enqueue_analysis(conn: Conn, run_id: int) -> int:
    """Queue an analysis of ``run_id``, superseding a queued one (the caller's transaction)."""
    now = now_iso()
    execute(
        conn,
        sa.update(_t)
        .where(_t.c.run_id == run_id, _t.c.status == "queued")
        .values(status="superseded", updated_at=now),
    )
    inserted = execute(
        conn,
        sa.insert(_t)
        .values(run_id=run_id, status="queued", attempts=0, created_at=now, updated_at=now)
        .returning(_t.c.id),
    )
    runs.set_run_state(
        conn, run_id=run_id, status="queued", progress="queued for analysis", error=None
    )
    return int(inserted.scalar())


def finish_task(conn: Conn, task_id: int, run_id: int, *, status: str, error: str | None) -> None:
    """End a task: ``status`` is the run's (``analysed`` marks the task ``done``)."""
    execute(
        conn,
        sa.update(_t)
        .where(_t.c.id == task_id)
        .values(
            status="done" if status == "analysed" else status,
            error=error,
            lease_expires_at=None,
            updated_at=now_iso(),
        ),
    )
    runs.set_run_state(
        conn,
        run_id=run_id,
        status=status,
        error=error,
        progress="done" if status == "analysed" else "failed",
    )


def expire_leases(conn: Conn, now: float, max_attempts: int) -> None:
    """Requeue running tasks whose lease ran out, or fail them when out of attempts. Rows
    another claimer is expiring right now are skipped (it does it)."""
    stale = execute(
        conn,
        sa.select(_t.c.id, _t.c.run_id, _t.c.attempts)
        .where(_t.c.status == "running", _t.c.lease_expires_at < now)
        .with_for_update(skip_locked=True),
    ).rows
    for task in stale:
        if (task["attempts"] or 0) >= max_attempts:
            reason = (
                f"analysis worker lost its lease {task['attempts']} time(s) (killed or hung);"
                " giving up"
            )
            finish_task(conn, task["id"], task["run_id"], status="failed", error=reason)
            continue
        execute(
            conn,
            sa.update(_t)
            .where(_t.c.id == task["id"], _t.c.status == "running")
            .values(status="queued", updated_at=now_iso()),
        )
        runs.set_run_state(
            conn,
            run_id=task["run_id"],
            status="queued",
            progress="requeued after a lost worker",
            touch=False,
        )


def claim_analysis(
    conn: Conn, *, worker: str, lease_s: float, max_attempts: int
) -> ClaimedTask | None:
    """Take the oldest queued task for ``worker`` (``host:pid``) with a lease of ``lease_s``."""
    now = time.time()
    with transaction(conn):
        expire_leases(conn, now, max_attempts)
        row = execute(
            conn,
            sa.select(_t.c.id, _t.c.run_id, _t.c.attempts)
            .where(_t.c.status == "queued")
            .order_by(_t.c.id)
            .limit(1)
            .with_for_update(skip_locked=True),
        ).first()
        if row is None:
            return None
        taken = execute(
            conn,
            sa.update(_t)
            .where(_t.c.id == row["id"], _t.c.status == "queued")
            .values(
                status="running",
                attempts=_t.c.attempts + 1,
                worker=worker,
                lease_expires_at=now + lease_s,
                updated_at=now_iso(),
            ),
        )
        if taken.rowcount != 1:
            return None
        runs.set_run_state(
            conn, run_id=row["run_id"], status="analysing", progress="starting", error=None
        )
    return ClaimedTask(int(row["id"]), int(row["run_id"]), int(row["attempts"] or 0) + 1)


def record_progress(conn: Conn, task: ClaimedTask, message: str, *, lease_s: float) -> None:
    """Show progress on the run and extend the task's lease (it is alive)."""
    with transaction(conn):
        execute(
            conn,
            sa.update(_t)
            .where(_t.c.id == task.id, _t.c.status == "running")
            .values(lease_expires_at=time.time() + lease_s, updated_at=now_iso()),
        )
        runs.set_run_state(
            conn, run_id=task.run_id, progress=message[:500], only_if_status="analysing"
        )


def holds(conn: Conn, task: ClaimedTask) -> bool:
    """Whether this claim of ``task`` still holds it: running, and not claimed again since
    (its lease expired and another worker took it: that worker's result is the one stored).
    The row stays locked to the caller's transaction's end (PostgreSQL), so a claimer
    expiring leases skips it meanwhile."""
    query = sa.select(_t.c.status, _t.c.attempts).where(_t.c.id == task.id).with_for_update()
    found = execute(conn, query).first()
    return found is not None and found["status"] == "running" and found["attempts"] == task.attempt


def fail_analysis(conn: Conn, task: ClaimedTask, error: str) -> None:
    """Record why the analysis failed (bad input is final: no retry)."""
    with transaction(conn):
        finish_task(conn, task.id, task.run_id, status="failed", error=error[:4000])


def requeue_analysis(conn: Conn, task: ClaimedTask, error: str) -> None:
    """Put a task back after an internal error (its attempt stays counted)."""
    with transaction(conn):
        execute(
            conn,
            sa.update(_t)
            .where(_t.c.id == task.id, _t.c.status == "running")
            .values(
                status="queued", error=error[:4000], lease_expires_at=None, updated_at=now_iso()
            ),
        )
        runs.set_run_state(
            conn,
            run_id=task.run_id,
            status="queued",
            progress="retrying after an internal error",
            error=error[:4000],
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def expire_orphaned_leases(conn: Conn, *, host: str) -> list[int]:
    """End now the leases of running tasks whose worker (``host:pid``) was on this host and
    is gone (a SIGKILLed API takes its worker along): the next claim requeues them at once
    instead of after the whole lease. Returns the task ids; other hosts' tasks keep theirs.
    """
    with transaction(conn):
        running = execute(
            conn, sa.select(_t.c.id, _t.c.worker).where(_t.c.status == "running")
        ).rows
        gone = []
        for task in running:
            name, sep, pid = str(task["worker"] or "").rpartition(":")
            if sep and name == host and pid.isdigit() and not _pid_alive(int(pid)):
                gone.append(int(task["id"]))
        if gone:
            execute(conn, sa.update(_t).where(_t.c.id.in_(gone)).values(lease_expires_at=0))
    return gone


def live_task_ids(conn: Conn, now: float) -> set[int]:
    """Tasks running under an unexpired lease (their scratch folders are in use)."""
    query = sa.select(_t.c.id).where(_t.c.status == "running", _t.c.lease_expires_at >= now)
    return {int(r["id"]) for r in execute(conn, query).rows}


def release_worker_leases(conn: Conn, *, worker: str) -> int:
    """End now the leases of ``worker``'s (``host:pid``) running tasks, a worker known dead:
    the next claim requeues them (the attempt stays counted). Returns how many."""
    update = sa.update(_t).where(_t.c.worker == worker, _t.c.status == "running")
    return execute(conn, update.values(lease_expires_at=0)).rowcount
