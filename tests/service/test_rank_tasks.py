"""A run's rank tasks and merge task in the queue (``service.storage.tasks``), on SQLite and on
PostgreSQL: the merge is claimable only once every rank task is done, a rank failing for good
fails the run naming it and drops its siblings, an expired rank lease is re-claimed, a new
analysis of the run supersedes the family, and the parts of finished runs are handed back for
deletion once."""

from __future__ import annotations

import functools
import time

from queue_store import QueueStore, add_run, rows_of

from service.storage import runs, schema, tasks
from service.storage.database import Database
from service.storage.engine import Conn, PostgresDatabase, transaction
from service.storage.tasks import ClaimedTask, TaskKind

AnyDb = Database | PostgresDatabase
SHA = [f"{i:x}" * 64 for i in range(1, 5)]


def _split_run(db: AnyDb, files: int, *, lease_s: float = 60) -> ClaimedTask:
    """A run with its analysis queued, claimed and split into ``files`` rank tasks."""

    def fill(conn: Conn) -> int:
        with transaction(conn):
            return tasks.enqueue_analysis(conn, add_run(conn))

    db.write(fill)
    run = _claim(db, lease_s=lease_s)
    assert run is not None and run.kind is TaskKind.RUN
    assert db.write(functools.partial(tasks.split_into_ranks, task=run, files=files))
    return run


def _claim(db: AnyDb, *, lease_s: float = 60, max_attempts: int = 2) -> ClaimedTask | None:
    claim = functools.partial(
        tasks.claim_analysis, worker="w", lease_s=lease_s, max_attempts=max_attempts
    )
    return db.write(claim)


def _complete(db: AnyDb, task: ClaimedTask, sha: str) -> bool:
    return db.write(functools.partial(tasks.complete_rank, task=task, part_sha256=sha))


def _run_row(db: AnyDb) -> dict[str, object]:
    (run,) = rows_of(db, schema.runs, "status", "progress", "error")
    return run


def test_the_merge_is_claimable_once_every_rank_task_is_done(queue_store: QueueStore) -> None:
    db = queue_store.open()
    merge = _split_run(db, 3)
    ranks = [_claim(db) for _ in range(3)]
    assert [(t.kind, t.part, t.parent_id) for t in ranks if t] == [
        (TaskKind.RANK, i, merge.id) for i in range(3)
    ]
    assert _claim(db) is None  # the merge waits
    other = queue_store.open()  # a worker on another host completes one of them
    for task, sha in zip(ranks[::-1][:2], SHA, strict=False):
        assert task is not None and _complete(other, task, sha)
        assert _claim(db) is None
    assert _run_row(db)["progress"] == "ranks: 2 of 3 files read and attributed"
    assert ranks[0] is not None and _complete(db, ranks[0], SHA[2])
    assert _run_row(db)["progress"] == "merging 3 files"
    claimed = _claim(db)
    assert claimed is not None and (claimed.id, claimed.kind) == (merge.id, TaskKind.MERGE)
    assert db.read(functools.partial(tasks.part_blobs, merge=claimed)) == [SHA[2], SHA[1], SHA[0]]
    status = db.read(lambda c: tasks.reclaim_parts(c, parent_id=merge.id))
    assert status == []  # the merge is running: its parts are needed
    db.write(lambda c: tasks.finish_task(c, merge.id, merge.run_id, status="analysed", error=None))
    assert db.write(lambda c: tasks.reclaim_parts(c, parent_id=merge.id)) == sorted(SHA[:3])
    assert db.write(lambda c: tasks.reclaim_parts(c, parent_id=None)) == []  # handed out once
    assert db.read(tasks.recorded_parts) == set()


def test_a_rank_failing_for_good_fails_the_run_naming_it(queue_store: QueueStore) -> None:
    db = queue_store.open()
    merge = _split_run(db, 3)
    first, second = _claim(db), _claim(db)
    assert first is not None and second is not None
    assert _complete(db, first, SHA[0])
    reason = "rank 1 (traces/rank1.json.gz): not a Kineto trace"
    db.write(lambda c: tasks.fail_analysis(c, second, reason))
    assert _run_row(db)["status"] == "failed" and _run_row(db)["error"] == reason
    assert _claim(db) is None  # the third rank task is dropped, not run
    rows = rows_of(db, schema.analysis_tasks, "kind", "status", "error")
    assert [(r["kind"], r["status"]) for r in rows] == [
        ("merge", "failed"),
        ("rank", "done"),
        ("rank", "failed"),
        ("rank", "cancelled"),
    ]
    assert rows[0]["error"] == reason
    assert db.write(lambda c: tasks.reclaim_parts(c, parent_id=merge.id)) == [SHA[0]]


def test_an_expired_rank_lease_is_reclaimed_then_fails_the_run(queue_store: QueueStore) -> None:
    db = queue_store.open()
    _split_run(db, 2)
    lost = _claim(db, lease_s=0.05)
    assert lost is not None and (lost.part, lost.attempt) == (0, 1)
    time.sleep(0.1)
    again = _claim(db, lease_s=0.05)
    assert again is not None and (again.id, again.part, again.attempt) == (lost.id, 0, 2)
    assert not _complete(db, lost, SHA[0])  # the stale claim cannot complete it
    time.sleep(0.1)
    taken = _claim(db)  # out of attempts: rank 0 fails the run; rank 1 is dropped
    assert taken is None
    run = _run_row(db)
    assert run["status"] == "failed" and "lost its lease 2 time(s)" in str(run["error"])


def test_a_new_analysis_supersedes_the_family(queue_store: QueueStore) -> None:
    db = queue_store.open()
    merge = _split_run(db, 2)
    running = _claim(db)
    assert running is not None
    db.write(lambda c: tasks.enqueue_analysis(c, merge.run_id))
    assert not _complete(db, running, SHA[0])  # its part is not wanted: the caller deletes it
    fresh = _claim(db)  # the queued rank task went with the merge; the new run task is next
    assert fresh is not None and fresh.kind is TaskKind.RUN and fresh.id > running.id
    statuses = [r["status"] for r in rows_of(db, schema.analysis_tasks, "status")]
    assert statuses == ["superseded", "cancelled", "superseded", "running"]


def test_deleting_a_run_hands_back_its_part_blobs(queue_store: QueueStore) -> None:
    db = queue_store.open()
    merge = _split_run(db, 2)
    done, running = _claim(db), _claim(db)
    assert done is not None and running is not None and _complete(db, done, SHA[0])
    gone = db.write(lambda c: runs.delete_run(c, run_id=merge.run_id))
    assert gone == [SHA[0]]  # the caller deletes it with the run's unshared blobs
    assert not _complete(db, running, SHA[1])  # the task went with the run: its part too
    assert db.read(tasks.recorded_parts) == set()
