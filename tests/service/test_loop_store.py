"""The pull-request loop's tables, the webhook deliveries, the worker heartbeats, the ``/health``
counts and the state tag, on SQLite and PostgreSQL (``service.storage.loop``, ``deliveries``,
``heartbeats``, ``health``, ``blob_rows``; ``Database.read_tagged`` and its PostgreSQL twin):
the same calls give the same answers on both."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from queue_store import QueueStore, add_run

from service import loop_store
from service.core.errors import NotFound
from service.storage import blob_rows, deliveries, health, heartbeats, jobs, loop, schema, tasks
from service.storage.engine import Conn, PostgresDatabase, execute, transaction


def _batch(conn: Conn, *, pr: int | None = 7, head: str = "a" * 40, suite: str = "smoke") -> Any:
    return loop.insert_batch(
        conn,
        repo="octo/model",
        pr_number=pr,
        head_sha=head,
        head_ref="feature",
        base_sha="b" * 40,
        base_ref="main",
        suite=suite,
        config_json='{"gpus": 1}',
        reason=None,
        delivery_id="d-1",
    )


def _job(conn: Conn, batch_id: int, name: str, *, pr: int | None = 7, head: str = "a" * 40) -> int:
    checkout = {"repo": "octo/model", "pr": pr, "sha": head, "base_sha": "b" * 40, "suite": "smoke"}
    return jobs.submit_checkout_job(
        conn,
        spec={"name": name},
        name=name,
        gpus=1,
        max_attempts=2,
        batch_id=batch_id,
        checkout=checkout,
    )


def _queue_two_heads(conn: Conn) -> dict[str, Any]:
    """PR 7: head ``a`` (two suites, one job each), then head ``c`` (smoke, one job); a push
    of branch ``main`` (no PR) on head ``e``."""
    with transaction(conn):
        first = _batch(conn)
        other_suite = _batch(conn, suite="full")
        duplicate = _batch(conn)  # the same commit and suite: left alone
        old_job = _job(conn, first, "ref")
        _job(conn, other_suite, "big")
        newer = _batch(conn, head="c" * 40)
        new_job = _job(conn, newer, "ref", head="c" * 40)
        taken = loop.supersede_older(conn, repo="octo/model", pr=7, suite="smoke", newest=newer)
        push = _batch(conn, pr=None, head="e" * 40)
        push_again = _batch(conn, pr=None, head="e" * 40)
    return {
        "first": first,
        "other_suite": other_suite,
        "duplicate": duplicate,
        "old_job": old_job,
        "newer": newer,
        "new_job": new_job,
        "taken": taken,
        "push": push,
        "push_again": push_again,
    }


def test_batches_jobs_and_pulls(queue_store: QueueStore) -> None:
    db = queue_store.open()
    ids = db.write(_queue_two_heads)
    assert ids["duplicate"] is None and ids["push_again"] is None  # one per commit and suite
    assert ids["taken"] == 1  # the older smoke batch's queued job left the queue
    first, newer, push = ids["first"], ids["newer"], ids["push"]

    superseded = db.read(lambda c: loop.batch_row(c, first))
    assert superseded is not None and superseded["status"] == "superseded"
    assert superseded["config_json"] == '{"gpus": 1}'
    old_job = db.read(lambda c: loop.get_job(c, job_id=ids["old_job"]))
    assert old_job is not None
    assert (old_job["status"], old_job["reason"]) == ("failed", "superseded by a newer push")
    assert old_job["spec_json"] == '{"name": "ref"}' and old_job["log_tail"] is None

    queued = db.read(loop.queued_batch_rows)
    assert [b["id"] for b in queued] == [ids["other_suite"], newer, push]
    assert db.read(lambda c: loop.count_batches(c, repo=None, pr=None)) == 4
    assert db.read(lambda c: loop.count_batches(c, repo="octo/model", pr=7)) == 3
    assert db.read(lambda c: loop.count_batches(c, repo="other/repo", pr=None)) == 0
    listed = db.read(lambda c: loop.list_batches(c, repo=None, pr=7, limit=2, offset=0))
    assert [(b["id"], b["jobs"]) for b in listed] == [(newer, 1), (ids["other_suite"], 1)]
    page_two = db.read(lambda c: loop.list_batches(c, repo=None, pr=7, limit=2, offset=2))
    assert [b["id"] for b in page_two] == [first]
    got = db.read(lambda c: loop.get_batch(c, batch_id=push))
    assert got is not None and got["pr_number"] is None and got["jobs"] == 0
    assert "config_json" not in got  # lists and pages never read the configuration
    assert db.read(lambda c: loop.get_batch(c, batch_id=10**9)) is None

    assert db.read(
        lambda c: loop.has_newer_batch(c, repo="octo/model", pr=7, suite="smoke", batch_id=first)
    )
    assert not db.read(
        lambda c: loop.has_newer_batch(c, repo="octo/model", pr=7, suite="smoke", batch_id=newer)
    )
    heads = db.read(lambda c: loop.commit_batch_ids(c, repo="octo/model", head_sha="a" * 40, pr=7))
    assert heads == [first, ids["other_suite"]]
    pushed = db.read(
        lambda c: loop.commit_batch_ids(c, repo="octo/model", head_sha="e" * 40, pr=None)
    )
    assert pushed == [push]

    outcomes = db.read(lambda c: loop.batch_job_outcomes(c, first))
    assert outcomes == [
        {
            "id": ids["old_job"],
            "name": "ref",
            "status": "failed",
            "run_id": None,
            "reason": "superseded by a newer push",
        }
    ]
    batch_jobs = db.read(
        lambda c: loop.list_jobs(c, batch_id=newer, status=None, limit=10, offset=0)
    )
    assert [j["id"] for j in batch_jobs] == [ids["new_job"]] and "spec_json" not in batch_jobs[0]
    failed = db.read(
        lambda c: loop.list_jobs(c, batch_id=None, status="failed", limit=10, offset=0)
    )
    assert [j["id"] for j in failed] == [ids["old_job"]]
    every = db.read(lambda c: loop.list_jobs(c, batch_id=None, status=None, limit=10, offset=0))
    assert [j["id"] for j in every] == sorted((j["id"] for j in every), reverse=True)

    pulls = loop_store.list_pulls(db)
    assert [(p.pr_number, p.head_sha, p.batches) for p in pulls] == [(7, "c" * 40, 3)]
    assert [s.id for s in pulls[0].suites] == [newer]  # the newest head's suites
    assert pulls[0].updated_at is not None
    assert [b.id for b in loop_store.list_batches(db, pr=7, limit=1)] == [newer]
    assert loop_store.count_batches(db, repo="octo/model") == 4
    assert loop_store.get_batch(db, push).pr_number is None
    with pytest.raises(NotFound, match="batch 999 does not exist"):
        loop_store.get_batch(db, 999)


def test_marking_a_batch(queue_store: QueueStore) -> None:
    db = queue_store.open()
    batch_id = db.write(lambda c: _batch(c))
    db.write(
        lambda c: loop.mark_batch(
            c,
            batch_id,
            status="published",
            state="success",
            comment_url="https://x/1",
            published_at="2026-01-01",
        )
    )
    row = db.read(lambda c: loop.batch_row(c, batch_id))
    assert row is not None
    assert (row["status"], row["state"], row["comment_url"]) == (
        "published",
        "success",
        "https://x/1",
    )
    assert row["updated_at"] >= row["created_at"]
    with pytest.raises(ValueError, match="config_json"):
        db.write(lambda c: loop.mark_batch(c, batch_id, config_json="{}"))
    assert db.read(lambda c: loop.batch_row(c, batch_id))["config_json"] == '{"gpus": 1}'  # type: ignore[index]


def test_deliveries_replay_guard(queue_store: QueueStore) -> None:
    db = queue_store.open()
    assert db.write(lambda c: deliveries.record_delivery(c, "g-1", "push", None))
    assert not db.write(lambda c: deliveries.record_delivery(c, "g-1", "push", None))  # replay
    assert db.read(lambda c: deliveries.delivery_outcome(c, "g-1")) == ""  # being handled
    db.write(lambda c: deliveries.set_outcome(c, "g-1", "queued " + "x" * 3000))
    outcome = db.read(lambda c: deliveries.delivery_outcome(c, "g-1"))
    assert outcome is not None and len(outcome) == deliveries.OUTCOME_CHARS
    assert db.read(lambda c: deliveries.delivery_outcome(c, "g-2")) is None
    db.write(lambda c: deliveries.forget_delivery(c, "g-1"))
    assert db.read(lambda c: deliveries.delivery_outcome(c, "g-1")) is None
    assert db.write(lambda c: deliveries.record_delivery(c, "g-1", "push", "opened"))


def test_heartbeats_runners_and_health_counts(queue_store: QueueStore) -> None:
    db = queue_store.open()
    empty = db.read(health.queue_counts)
    assert empty == health.QueueCounts(0, 0, None, None)
    db.write(
        lambda c: heartbeats.record_beat(
            c, name="h:1", started_at="t0", beat_at=100.0, state="alive"
        )
    )
    db.write(
        lambda c: heartbeats.record_beat(
            c, name="h:1", started_at="t1", beat_at=150.0, state="alive"
        )
    )
    db.write(
        lambda c: heartbeats.record_beat(
            c, name="h:2", started_at="t0", beat_at=900.0, state="stopped"
        )
    )
    db.write(
        lambda c: heartbeats.record_beat(
            c, name="h:old", started_at="t0", beat_at=1.0, state="alive"
        )
    )
    assert db.read(lambda c: heartbeats.last_beat(c, "h:1")) == 150.0
    assert db.read(lambda c: heartbeats.last_beat(c, "h:none")) is None
    started = db.read(
        lambda c: execute(
            c,
            sa.select(schema.worker_heartbeats.c.started_at).where(
                schema.worker_heartbeats.c.name == "h:1"
            ),
        ).scalar()
    )
    assert started == "t0"  # a later beat keeps the start
    assert db.write(lambda c: heartbeats.prune_heartbeats(c, now=heartbeats.HISTORY_S + 50)) == 1
    assert db.read(lambda c: heartbeats.last_beat(c, "h:old")) is None

    def queue_work(conn: Conn) -> None:
        tasks.enqueue_analysis(conn, add_run(conn, "a"))
        tasks.enqueue_analysis(conn, add_run(conn, "b"))
        jobs.submit_job(conn, spec={}, spec_yaml=None, name="j", gpus=0, max_attempts=1)
        jobs.touch_runner(conn, "gpu-1", gpus=8)

    db.write(queue_work)
    counts = db.read(health.queue_counts)
    assert (counts.analyses_queued, counts.jobs_queued, counts.newest_alive_beat) == (2, 1, 150.0)
    assert counts.oldest_queued_analysis is not None
    runners = db.read(jobs.list_runners)
    assert [(r["name"], r["gpus"]) for r in runners] == [("gpu-1", 8)]


def test_blob_digests_and_state_tag(queue_store: QueueStore) -> None:
    db = queue_store.open()
    assert db.read(blob_rows.recorded_digests) == set()
    tag = db.read_tagged(lambda c, t: t)
    assert db.read_tagged(lambda c, t: t) == tag  # nothing written: the same tag
    insert = sa.insert(schema.blobs).values(sha256="f" * 64, size=1, created_at="t")
    db.write(lambda c: execute(c, insert))
    moved = db.read_tagged(lambda c, t: t)
    assert moved != tag
    assert db.read_tagged(lambda c, t: (t, blob_rows.recorded_digests(c))) == (moved, {"f" * 64})
    if isinstance(db, PostgresDatabase):  # one snapshot for all hosts: another pool agrees
        other = queue_store.open()
        assert other.read_tagged(lambda c, t: t) == moved
