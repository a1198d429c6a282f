"""Analysis-queue claim throughput on SQLite and PostgreSQL: W worker processes drain N
queued tasks (claim with a lease, mark done: ``service.storage.tasks``), for W in 1, 2, 4.

Prints one table: backend, workers, tasks, wall seconds (first claim to last completion; the
workers' start-up is not timed), tasks per second, and whether every task was done exactly
once. PostgreSQL needs a server: ``--postgres postgresql://...`` names
an empty database the script may create tables in (each trial drops and recreates them).

    python benchmarks/queue_claims.py --tasks 1000 --postgres postgresql://USER@HOST/DB
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from service.auth import now_iso
from service.storage import schema, tasks
from service.storage.database import Database
from service.storage.engine import Conn, PostgresDatabase, execute, transaction
from service.storage.migrations import apply_migrations


def _open(url: str) -> Database | PostgresDatabase:
    if url.startswith("postgresql"):
        return PostgresDatabase(url, pool_size=1)
    db = Database(Path(url), busy_timeout_ms=60000)
    db.start()
    return db


def _complete(conn: Conn, task: tasks.ClaimedTask) -> bool:
    with transaction(conn):
        if not tasks.holds(conn, task):
            return False
        tasks.finish_task(conn, task.id, task.run_id, status="analysed", error=None)
    return True


def _drain(url: str, name: str, start_at: float) -> tuple[int, float, float]:
    """Drain the queue from ``start_at`` (epoch seconds: every worker has started by then, so
    interpreter start-up is not timed); returns (tasks done, first claim, last completion)."""
    db = _open(url)
    claim = functools.partial(tasks.claim_analysis, worker=name, lease_s=60, max_attempts=3)
    time.sleep(max(0.0, start_at - time.time()))
    first = time.time()
    done = 0
    while (task := db.write(claim)) is not None:
        done += db.write(functools.partial(_complete, task=task))
    last = time.time()
    db.close()
    return done, first, last


def _prepare(url: str, count: int) -> None:
    db = _open(url)
    if isinstance(db, PostgresDatabase):
        with db.engine.begin() as conn:
            schema.metadata.drop_all(conn)
        db.apply_schema()
    else:
        db.write(apply_migrations)

    def fill(conn: Conn) -> None:
        now = now_iso()
        with transaction(conn):
            for i in range(count):
                insert = sa.insert(schema.runs).values(
                    name=f"r{i}", source="bench", status="queued", created_at=now
                )
                run_id = execute(conn, insert.returning(schema.runs.c.id)).scalar()
                tasks.enqueue_analysis(conn, run_id)

    db.write(fill)
    db.close()


def trial(label: str, url: str, workers: int, count: int) -> dict[str, object]:
    _prepare(url, count)
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 5 + 3 * workers  # past every worker's start-up, even under load
    with ctx.Pool(workers) as pool:
        found = pool.starmap(_drain, [(url, f"w{i}", start_at) for i in range(workers)])
    done = [n for n, _, _ in found]
    wall = max(last for _, _, last in found) - min(first for _, first, _ in found)
    db = _open(url)
    t = schema.analysis_tasks
    states = db.write(lambda c: execute(c, sa.select(t.c.status, t.c.attempts)).rows)
    db.close()
    once = sum(done) == count and all(s == {"status": "done", "attempts": 1} for s in states)
    return {"backend": label, "workers": workers, "tasks": count, "wall_s": wall, "once": once}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--postgres", default="", help="an empty PostgreSQL database's URL")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", str(Path(tmp) / "bench.db"))]
        if args.postgres:
            backends.append(("postgresql", args.postgres))
        for label, url in backends:
            for workers in args.workers:
                if label == "sqlite":
                    Path(url).unlink(missing_ok=True)
                rows.append(trial(label, url, workers, args.tasks))
    print("| backend | workers | tasks | wall s | tasks/s | each done once |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        wall = float(str(r["wall_s"]))
        print(
            f"| {r['backend']} | {r['workers']} | {r['tasks']} | {wall:.2f} |"
            f" {args.tasks / wall:.0f} | {'yes' if r['once'] else 'NO'} |"
        )


if __name__ == "__main__":
    main()
