"""The analysis task queue's statements, on either backend: enqueue, claim with a lease,
extend it, finish, requeue.

A claim takes the oldest queued task inside :func:`service.storage.engine.transaction`: on
SQLite under ``BEGIN IMMEDIATE`` (one writer at a time, file-wide), on PostgreSQL with
``SELECT ... FOR UPDATE SKIP LOCKED``, so any number of workers on any hosts each lock a
different row and never wait on one another; the conditional ``UPDATE ... WHERE status =
'queued'`` after it is the second guard. A task whose lease ran out (its worker was killed or
hung) is requeued by the next claim, at most ``max_attempts`` times, then fails with the
reason: a killed worker's task runs again exactly once per lost lease.

A run of several trace files is analysed per rank: its task (kind ``run``), once claimed, is
split (:func:`split_into_ranks`) into one ``rank`` task per file and becomes the ``merge``
task, ``waiting`` until the last rank task completes (:func:`complete_rank` queues it in the
same transaction, under the merge row's lock: no polling), so workers on any hosts share the
run's files. Rank tasks take leases and attempts like any task; one failing for good fails the
merge and the run, naming its file, and the family's other rank tasks are dropped when next
claimed (``cancelled``). Each rank task records the content address of the part blob it wrote
(``part_sha256``); :func:`reclaim_parts` hands the worker those of finished families to delete.
Locks are taken rank row first, then the merge row, on every path (no deadlock).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from service.auth import now_iso
from service.storage import runs, schema
from service.storage.engine import Conn, execute, transaction

_t = schema.analysis_tasks


class TaskKind(StrEnum):
    """What a task does (the ``kind`` column)."""

    RUN = "run"
    """The run's analysis: in one process, or split into rank tasks once claimed."""
    RANK = "rank"
    """One trace file of a run read and attributed into a part blob."""
    MERGE = "merge"
    """The run's parts merged into its report, once every rank task is done."""


WAITING = "waiting"
"""The status of a merge task whose rank tasks are not all done (nobody may claim it)."""


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this worker holds until its lease runs out."""

    id: int
    run_id: int
    attempt: int
    kind: TaskKind = TaskKind.RUN
    part: int | None = None
    """A rank task's file: its index among the run's analysed trace files."""
    parent_id: int | None = None
    """A rank task's merge task."""


def enqueue_analysis(conn: Conn, run_id: int) -> int:
    """Queue an analysis of ``run_id``, superseding a queued one (the caller's transaction)."""
    now = now_iso()
    execute(
        conn,
        sa.update(_t)
        .where(_t.c.run_id == run_id, _t.c.status.in_(("queued", WAITING)))
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
        sa.select(_t.c.id, _t.c.run_id, _t.c.attempts, _t.c.kind, _t.c.parent_id, _t.c.part)
        .where(_t.c.status == "running", _t.c.lease_expires_at < now)
        .with_for_update(skip_locked=True),
    ).rows
    for task in stale:
        if (task["attempts"] or 0) >= max_attempts:
            reason = (
                f"analysis worker lost its lease {task['attempts']} time(s) (killed or hung);"
                " giving up"
            )
            if task["kind"] == TaskKind.RANK:
                fail_rank(conn, _claimed(task, int(task["attempts"])), reason)
            else:
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
            **_requeued_run_status(TaskKind(task["kind"])),
            progress="requeued after a lost worker",
            touch=False,
        )


def _claimed(row: dict[str, Any], attempt: int) -> ClaimedTask:
    part, parent = row["part"], row["parent_id"]
    return ClaimedTask(
        int(row["id"]),
        int(row["run_id"]),
        attempt,
        TaskKind(row["kind"]),
        None if part is None else int(part),
        None if parent is None else int(parent),
    )


def claim_analysis(
    conn: Conn,
    *,
    worker: str,
    lease_s: float,
    max_attempts: int,
    kinds: Collection[TaskKind] | None = None,
) -> ClaimedTask | None:
    """Take the oldest queued task (of ``kinds``: default any) for ``worker`` (``host:pid``)
    with a lease of ``lease_s``. A rank task whose run's analysis ended meanwhile (failed,
    superseded) is dropped on the way (``cancelled``), not run."""
    now = time.time()
    with transaction(conn):
        expire_leases(conn, now, max_attempts)
        while True:
            query = sa.select(
                _t.c.id, _t.c.run_id, _t.c.attempts, _t.c.kind, _t.c.parent_id, _t.c.part
            ).where(_t.c.status == "queued")
            if kinds is not None:
                query = query.where(_t.c.kind.in_([str(k) for k in kinds]))
            row = execute(
                conn, query.order_by(_t.c.id).limit(1).with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            if row["kind"] == TaskKind.RANK and _status(conn, row["parent_id"]) != WAITING:
                execute(
                    conn,
                    sa.update(_t)
                    .where(_t.c.id == row["id"])
                    .values(status="cancelled", updated_at=now_iso()),
                )
                continue
            break
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
    return _claimed(row, int(row["attempts"] or 0) + 1)


def _status(conn: Conn, task_id: int | None, *, lock: bool = False) -> str | None:
    """A task's status (``lock``: its row held to the transaction's end)."""
    query = sa.select(_t.c.status).where(_t.c.id == task_id)
    found = execute(conn, query.with_for_update() if lock else query).first()
    return None if found is None else str(found["status"])


def split_into_ranks(conn: Conn, task: ClaimedTask, files: int) -> bool:
    """Turn the claimed ``run`` task into the merge task of ``files`` rank tasks (the run's
    analysed trace files, in their order); False when the claim was lost meanwhile."""
    with transaction(conn):
        if not holds(conn, task):
            return False
        now = now_iso()
        for part in range(files):
            execute(
                conn,
                sa.insert(_t).values(
                    run_id=task.run_id, status="queued", kind=TaskKind.RANK.value, attempts=0,
                    parent_id=task.id, part=part, created_at=now, updated_at=now,
                ),
            )  # fmt: skip
        execute(
            conn,
            sa.update(_t)
            .where(_t.c.id == task.id)
            .values(
                kind=TaskKind.MERGE.value, status=WAITING, attempts=0, worker=None,
                lease_expires_at=None, updated_at=now,
            ),
        )  # fmt: skip
        runs.set_run_state(
            conn, run_id=task.run_id, progress=f"ranks: 0 of {files} files read and attributed"
        )
    return True


def complete_rank(conn: Conn, task: ClaimedTask, part_sha256: str) -> bool:
    """Record the part blob of a rank task; the last of its run's rank tasks queues the merge.

    False when the part is not wanted (the claim was lost, or the run's analysis ended
    meanwhile): the caller deletes the blob it wrote.
    """
    with transaction(conn):
        if not holds(conn, task):
            return False
        if _status(conn, task.parent_id, lock=True) != WAITING:
            execute(
                conn,
                sa.update(_t)
                .where(_t.c.id == task.id)
                .values(status="cancelled", lease_expires_at=None, updated_at=now_iso()),
            )
            return False
        execute(
            conn,
            sa.update(_t)
            .where(_t.c.id == task.id)
            .values(
                status="done", part_sha256=part_sha256, lease_expires_at=None,
                updated_at=now_iso(),
            ),
        )  # fmt: skip
        # the merge row's lock serialises the family's completions: the last one sees the
        # others' committed rows (each statement reads afresh under READ COMMITTED)
        family = execute(
            conn,
            sa.select(_t.c.status, sa.func.count().label("n"))
            .where(_t.c.parent_id == task.parent_id)
            .group_by(_t.c.status),
        ).rows
        counts = {str(r["status"]): int(r["n"]) for r in family}
        total, done = sum(counts.values()), counts.get("done", 0)
        if done == total:
            execute(
                conn,
                sa.update(_t)
                .where(_t.c.id == task.parent_id, _t.c.status == WAITING)
                .values(status="queued", updated_at=now_iso()),
            )
            progress = f"merging {total} files"
        else:
            progress = f"ranks: {done} of {total} files read and attributed"
        runs.set_run_state(conn, run_id=task.run_id, progress=progress)
    return True


def fail_rank(conn: Conn, task: ClaimedTask, error: str) -> None:
    """A rank task failed for good: so do its merge task and the run (the caller's
    transaction; the rank row is locked already)."""
    execute(
        conn,
        sa.update(_t)
        .where(_t.c.id == task.id)
        .values(status="failed", error=error, lease_expires_at=None, updated_at=now_iso()),
    )
    parent = task.parent_id
    if parent is not None and _status(conn, parent, lock=True) == WAITING:
        finish_task(conn, parent, task.run_id, status="failed", error=error)


def part_blobs(conn: Conn, merge: ClaimedTask) -> list[str]:
    """The part blobs of a merge task's rank tasks, in the run's file order."""
    query = (
        sa.select(_t.c.part_sha256)
        .where(_t.c.parent_id == merge.id, _t.c.status == "done")
        .order_by(_t.c.part)
    )
    return [str(r["part_sha256"]) for r in execute(conn, query).rows]


def reclaim_parts(conn: Conn, *, parent_id: int | None = None) -> list[str]:
    """The part blobs of finished analyses (their merge task no longer waiting, queued or
    running), forgotten here: the caller deletes them. ``parent_id``: that run's only (after
    its merge or its failure); None: every finished one (at a worker's start)."""
    parent = sa.alias(_t)
    finished = sa.exists().where(
        parent.c.id == _t.c.parent_id, parent.c.status.not_in(("queued", "running", WAITING))
    )
    query = sa.select(_t.c.id, _t.c.part_sha256).where(_t.c.part_sha256.is_not(None), finished)
    if parent_id is not None:
        query = query.where(_t.c.parent_id == parent_id)
    with transaction(conn):
        found = execute(conn, query).rows
        if found:
            ids = [r["id"] for r in found]
            execute(conn, sa.update(_t).where(_t.c.id.in_(ids)).values(part_sha256=None))
    return sorted({str(r["part_sha256"]) for r in found})


def recorded_parts(conn: Conn) -> set[str]:
    """Every part blob a rank task recorded and no merge has reclaimed (kept by the blob
    sweep)."""
    query = sa.select(_t.c.part_sha256).where(_t.c.part_sha256.is_not(None))
    return {str(r["part_sha256"]) for r in execute(conn, query).rows}


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
    """Record why the analysis failed (bad input is final: no retry); a rank task's failure
    fails its run, unless this claim was lost meanwhile."""
    with transaction(conn):
        if task.kind is TaskKind.RANK:
            if holds(conn, task):
                fail_rank(conn, task, error[:4000])
            return
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
            **_requeued_run_status(task.kind),
            progress="retrying after an internal error",
            error=error[:4000],
        )


def _requeued_run_status(kind: TaskKind) -> dict[str, Any]:
    """A requeued task queues its run again, unless it is one of the run's rank tasks: the
    others may be running (the run stays ``analysing``)."""
    return {} if kind is TaskKind.RANK else {"status": "queued"}


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
