"""The analysis task queue (``service.storage.tasks``) on SQLite and PostgreSQL: each task
claimed once by concurrent workers, leases that expire and are re-claimed, a stale claim that
cannot complete; and, on PostgreSQL, worker processes: 4 of them drain 200 tasks each done
exactly once, and a SIGKILLed worker's task finishes once after its lease expired."""

from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from postgres_server import PostgresServer
from queue_store import QueueStore, add_run, rows_of
from queue_worker import run_worker

from service.storage import schema, tasks
from service.storage.database import Database
from service.storage.engine import Backend, Conn, PostgresDatabase, transaction

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _enqueue(db: Database | PostgresDatabase, count: int) -> list[int]:
    """``count`` runs with a queued task each, in one transaction."""

    def fill(conn: Conn) -> list[int]:
        with transaction(conn):
            return [tasks.enqueue_analysis(conn, add_run(conn, f"r{i}")) for i in range(count)]

    return db.write(fill)


def test_concurrent_claims_take_each_task_once(queue_store: QueueStore) -> None:
    db = queue_store.open()
    ids = _enqueue(db, 30)
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(6)

    def work(name: str, own: Database | PostgresDatabase) -> None:
        claim = functools.partial(tasks.claim_analysis, worker=name, lease_s=60, max_attempts=3)
        barrier.wait()
        mine = got.setdefault(name, [])
        while (task := own.write(claim)) is not None:
            mine.append(task.id)
            time.sleep(0.002)

    threads = [threading.Thread(target=work, args=(f"w{i}", queue_store.open())) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(i for mine in got.values() for i in mine) == ids
    assert sum(1 for mine in got.values() if mine) > 1
    runs = rows_of(db, schema.runs, "status", "progress")
    assert {r["status"] for r in runs} == {"analysing"}


def test_expired_lease_is_reclaimed_and_the_stale_claim_cannot_complete(
    queue_store: QueueStore,
) -> None:
    db = queue_store.open()
    (task_id,) = _enqueue(db, 1)
    claim = functools.partial(tasks.claim_analysis, lease_s=0.05, max_attempts=2)
    lost = db.write(functools.partial(claim, worker="dead"))
    assert lost is not None and (lost.id, lost.attempt) == (task_id, 1)
    time.sleep(0.1)
    again = db.write(functools.partial(claim, worker="alive"))
    assert again is not None and (again.id, again.attempt) == (task_id, 2)
    assert db.write(functools.partial(tasks.holds, task=again))
    assert not db.write(functools.partial(tasks.holds, task=lost))  # it was claimed again
    time.sleep(0.1)
    assert db.write(functools.partial(claim, worker="third")) is None  # out of attempts
    (task,) = rows_of(db, schema.analysis_tasks, "status", "attempts")
    (run,) = rows_of(db, schema.runs, "status", "error")
    assert task == {"status": "failed", "attempts": 2}
    assert run["status"] == "failed" and "lost its lease 2 time(s)" in run["error"]


def _workers(url: str, log: Path, count: int, work_s: float, lease_s: float) -> list[Any]:
    """Worker processes, forked: they start in milliseconds (no second interpreter importing
    the service), so the test measures the queue, not the machine's load."""
    fork = multiprocessing.get_context("fork")
    procs = [
        fork.Process(target=run_worker, args=(url, str(log), work_s, lease_s)) for _ in range(count)
    ]
    for p in procs:
        p.start()
    return procs


def _log_counts(log: Path) -> dict[str, collections.Counter[int]]:
    counts: dict[str, collections.Counter[int]] = {
        "start": collections.Counter(),
        "done": collections.Counter(),
    }
    for line in log.read_text().splitlines():
        kind, task_id, _ = line.split()
        counts[kind][int(task_id)] += 1
    return counts


@pytest.fixture
def pg_queue(postgres: PostgresServer) -> QueueStore:
    store = QueueStore(Backend.POSTGRESQL, postgres.new_database())
    yield store
    store.close()


@pytest.mark.timeout(30)
def test_four_worker_processes_do_200_tasks_each_once(pg_queue: QueueStore, tmp_path: Path) -> None:
    db = pg_queue.open()
    ids = _enqueue(db, 200)
    log = tmp_path / "log"
    procs = _workers(pg_queue.url, log, 4, work_s=0.0, lease_s=30)
    for p in procs:
        p.join(timeout=25)
        assert p.exitcode == 0
    counts = _log_counts(log)
    assert sorted(counts["done"]) == ids and set(counts["done"].values()) == {1}
    assert set(counts["start"].values()) == {1}  # no task ran twice
    assert {t["status"] for t in rows_of(db, schema.analysis_tasks, "status")} == {"done"}


@pytest.mark.timeout(30)
def test_sigkilled_worker_task_finishes_once_after_lease_expiry(
    pg_queue: QueueStore, tmp_path: Path
) -> None:
    db = pg_queue.open()
    (task_id,) = _enqueue(db, 1)
    log = tmp_path / "log"
    (victim,) = _workers(pg_queue.url, log, 1, work_s=60, lease_s=1.0)
    deadline = time.monotonic() + 15
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text().split() == ["start", str(task_id), "1"]  # mid-task
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=5)
    (rescuer,) = _workers(pg_queue.url, log, 1, work_s=0.2, lease_s=1.0)
    rescuer.join(timeout=20)
    assert rescuer.exitcode == 0
    assert log.read_text().splitlines() == [
        f"start {task_id} 1",
        f"start {task_id} 2",
        f"done {task_id} 2",
    ]
    (task,) = rows_of(db, schema.analysis_tasks, "status", "attempts")
    assert task == {"status": "done", "attempts": 2}
