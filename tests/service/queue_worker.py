"""An analysis-queue worker for the multi-process tests: the real claim, lease heartbeat and
completion (``service.storage.tasks``) around a job that only sleeps.

``run_worker(url, log, work_s, lease_s)`` is a process's target (forked from the test, so it
starts without importing anything again): it claims tasks until the queue stays empty for a
second; appends ``start ID ATTEMPT`` before the work and ``done ID ATTEMPT`` once its
completion committed, so the test counts how often each task ran and finished.
"""

from __future__ import annotations

import functools
import os
import time

from sqlalchemy import Connection

from service.storage import tasks
from service.storage.engine import PostgresDatabase, transaction


def complete(conn: Connection, task: tasks.ClaimedTask) -> bool:
    """Mark the task done once, unless this claim lost it (``tasks.holds``)."""
    with transaction(conn):
        if not tasks.holds(conn, task):
            return False
        tasks.finish_task(conn, task.id, task.run_id, status="analysed", error=None)
    return True


def work(db: PostgresDatabase, task: tasks.ClaimedTask, work_s: float, lease_s: float) -> None:
    """Sleep ``work_s``, extending the lease as the real worker's progress lines do."""
    beat = functools.partial(tasks.record_progress, task=task, message="working", lease_s=lease_s)
    end = time.monotonic() + work_s
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, lease_s / 4))
        db.write(beat)


def run_worker(url: str, log_path: str, work_s: float, lease_s: float) -> None:
    db = PostgresDatabase(url, pool_size=1)
    claim = functools.partial(
        tasks.claim_analysis, worker=f"test:{os.getpid()}", lease_s=lease_s, max_attempts=3
    )
    idle_since = time.monotonic()
    with open(log_path, "a", buffering=1) as log:
        while time.monotonic() - idle_since < 1.0:
            task = db.write(claim)
            if task is None:
                time.sleep(0.05)
                continue
            log.write(f"start {task.id} {task.attempt}\n")
            work(db, task, work_s, lease_s)
            if db.write(functools.partial(complete, task=task)):
                log.write(f"done {task.id} {task.attempt}\n")
            idle_since = time.monotonic()
    db.close()
