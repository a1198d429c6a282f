"""The workload job queue runners pull from: claim with a lease, heartbeat, finish, requeue;
every statement on ``jobs`` and ``runners``, on either backend.

A claim takes the oldest queued job that fits inside ``engine.transaction``: ``BEGIN
IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL (runners on many
hosts each lock a different row), then a conditional ``UPDATE ... WHERE status = 'queued'``, so
two runners can never both get a job. An expired lease puts the job back in the queue until
``max_attempts`` claims were used; then it fails with the reason.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from service.auth import now_iso
from service.core.errors import Conflict, Forbidden, NotFound
from service.storage import runs, schema
from service.storage.engine import Conn, execute, insert_for, transaction

_j = schema.jobs
_r = schema.runners


def submit_job(
    conn: Conn,
    *,
    spec: dict[str, Any],
    spec_yaml: str | None,
    name: str,
    gpus: int,
    max_attempts: int,
) -> int:
    """Queue a validated workload spec."""
    now = now_iso()
    with transaction(conn):
        inserted = execute(
            conn,
            sa.insert(_j)
            .values(
                name=name, spec_json=json.dumps(spec), spec_yaml=spec_yaml, gpus=gpus,
                status="queued", attempts=0, max_attempts=max_attempts, created_at=now,
                updated_at=now,
            )
            .returning(_j.c.id),
        )  # fmt: skip
    return int(inserted.scalar())


def submit_checkout_job(
    conn: Conn,
    *,
    spec: dict[str, Any],
    name: str,
    gpus: int,
    max_attempts: int,
    batch_id: int,
    checkout: dict[str, Any],
) -> int:
    """Queue a spec that runs on a checkout of a repository's commit (the pull-request loop).

    ``checkout`` (``service.github_loop.models.JobCheckout`` as JSON) goes to the runner with the
    claim; repo, PR number, head/base SHA and suite are also columns, for lookups. The caller
    holds the transaction (a batch and its jobs are queued together).
    """
    now = now_iso()
    inserted = execute(
        conn,
        sa.insert(_j)
        .values(
            name=name, spec_json=json.dumps(spec), gpus=gpus, status="queued", attempts=0,
            max_attempts=max_attempts, created_at=now, updated_at=now, batch_id=batch_id,
            repo=checkout["repo"], pr_number=checkout.get("pr"), head_sha=checkout["sha"],
            base_sha=checkout.get("base_sha"), suite=checkout["suite"],
            checkout_json=json.dumps(checkout),
        )
        .returning(_j.c.id),
    )  # fmt: skip
    return int(inserted.scalar())


def batch_jobs(conn: Conn, batch_id: int) -> list[dict[str, Any]]:
    """The jobs of one pull-request batch, in queue order, with their outcome."""
    c = _j.c
    query = sa.select(c.id, c.name, c.status, c.run_id, c.reason, c.log_tail, c.spec_json)
    return execute(conn, query.where(c.batch_id == batch_id).order_by(c.id)).rows


def list_runners(conn: Conn, *, limit: int = 1000) -> list[dict[str, Any]]:
    """The runners that claimed work, most recently seen first."""
    query = sa.select(_r).order_by(_r.c.last_seen.desc().nulls_last()).limit(limit)
    return execute(conn, query).rows


def touch_runner(
    conn: Conn, runner: str, *, gpus: int | None = None, job_id: int | None = None
) -> None:
    """Record that a runner was seen (registration is implicit in its first claim)."""
    now = now_iso()
    insert = insert_for(conn, _r).values(
        name=runner, gpus=gpus, first_seen=now, last_seen=now, current_job_id=job_id
    )
    execute(
        conn,
        insert.on_conflict_do_update(
            index_elements=[_r.c.name],
            set_={
                "last_seen": insert.excluded.last_seen,
                "gpus": sa.func.coalesce(insert.excluded.gpus, _r.c.gpus),
                "current_job_id": insert.excluded.current_job_id,
            },
        ),
    )


def expire_leases(conn: Conn, now: float) -> int:
    """Requeue (or fail, when out of attempts) running jobs whose lease ran out; rows another
    claimer is expiring right now are skipped."""
    c = _j.c
    stale = execute(
        conn,
        sa.select(c.id, c.attempts, c.max_attempts, c.runner)
        .where(c.status == "running", c.lease_expires_at < now)
        .with_for_update(skip_locked=True),
    ).rows
    for job in stale:
        if (job["attempts"] or 0) >= (job["max_attempts"] or 0):
            values: dict[str, Any] = {
                "status": "failed",
                "reason": f"lease expired on runner {job['runner']!r}; gave up after "
                f"{job['attempts']} attempt(s)",
                "lease_expires_at": None,
            }
        else:
            values = {
                "status": "queued",
                "runner": None,
                "lease_expires_at": None,
                "reason": f"requeued: lease expired on runner {job['runner']!r}",
            }
        execute(conn, sa.update(_j).where(c.id == job["id"]).values(**values, updated_at=now_iso()))
    return len(stale)


def claim_job(
    conn: Conn,
    *,
    runner: str,
    gpus: int,
    lease_s: float,
    token_id: int | None = None,
) -> dict[str, Any] | None:
    """Give the oldest queued job that fits ``gpus`` to ``runner``; None when there is none.

    ``token_id`` (the claiming token) owns the job: only it, or an admin, may act on it.
    """
    now = time.time()
    c = _j.c
    with transaction(conn):
        expire_leases(conn, now)
        job = execute(
            conn,
            sa.select(c.id)
            .where(c.status == "queued", c.gpus <= gpus)
            .order_by(c.id)
            .limit(1)
            .with_for_update(skip_locked=True),
        ).first()
        claimed = None
        if job is not None:
            taken = execute(
                conn,
                sa.update(_j)
                .where(c.id == job["id"], c.status == "queued")
                .values(
                    status="running", runner=runner, attempts=c.attempts + 1,
                    lease_expires_at=now + lease_s, claim_token_id=token_id,
                    updated_at=now_iso(),
                )
                .returning(c.id, c.spec_json, c.lease_expires_at, c.checkout_json),
            )  # fmt: skip
            claimed = taken.first()
        touch_runner(conn, runner, gpus=gpus, job_id=claimed["id"] if claimed else None)
    if claimed is None:
        return None
    return {
        "id": claimed["id"],
        "spec": json.loads(claimed["spec_json"]),
        "lease_expires_at": claimed["lease_expires_at"],
        "checkout": json.loads(claimed["checkout_json"]) if claimed["checkout_json"] else None,
    }


def _held(conn: Conn, job_id: int, runner: str | None, owner: int | None = None) -> dict[str, Any]:
    """The job, held by a live lease (and, with ``owner``, claimed by that token); its row is
    locked until the caller's transaction ends (PostgreSQL)."""
    c = _j.c
    job = execute(
        conn,
        sa.select(c.id, c.status, c.runner, c.lease_expires_at, c.claim_token_id)
        .where(c.id == job_id)
        .with_for_update(),
    ).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist")

    if job["status"] != "running" or (job["lease_expires_at"] or 0) < time.time():
        raise Conflict(f"job {job_id} is not held by a live lease (status {job['status']})")
    if owner is not None and job["claim_token_id"] != owner:
        raise Forbidden(
            f"job {job_id} is held by another runner ({job['runner']!r}); a runner token may "
            "act only on the jobs it claimed"
        )
    if runner is not None and job["runner"] != runner:
        raise Conflict(f"job {job_id} is held by runner {job['runner']!r}, not {runner!r}")
    return job


def heartbeat_job(
    conn: Conn,
    job_id: int,
    *,
    lease_s: float,
    runner: str | None = None,
    owner: int | None = None,
) -> float:
    """Extend a live lease; :raises Conflict: the lease was lost (the runner must stop);
    :raises Forbidden: ``owner`` (a token id) did not claim the job."""
    with transaction(conn):
        job = _held(conn, job_id, runner, owner)
        expires = time.time() + lease_s
        execute(
            conn,
            sa.update(_j)
            .where(_j.c.id == job_id)
            .values(lease_expires_at=expires, updated_at=now_iso()),
        )
        touch_runner(conn, job["runner"], job_id=job_id)
    return expires


def finish_job(
    conn: Conn,
    job_id: int,
    *,
    status: str,
    run_id: int | None = None,
    reason: str | None = None,
    log_tail: str | None = None,
    runner: str | None = None,
    owner: int | None = None,
) -> None:
    """Mark a held job completed or failed."""
    with transaction(conn):
        job = _held(conn, job_id, runner, owner)
        if run_id is not None:
            _check_result(conn, job_id, run_id, owner)
        execute(
            conn,
            sa.update(_j)
            .where(_j.c.id == job_id)
            .values(
                status=status, run_id=run_id, reason=reason,
                log_tail=(log_tail or "")[-20000:] or None, lease_expires_at=None,
                updated_at=now_iso(),
            ),
        )  # fmt: skip
        if run_id is not None:
            runs.link_job(conn, run_id=run_id, job_id=job_id)
        touch_runner(conn, job["runner"], job_id=None)


def _check_result(conn: Conn, job_id: int, run_id: int, owner: int | None) -> None:
    """A job's run exists, is no other job's, and (``owner``: a runner token) was uploaded by
    that token."""
    runs.require_run(conn, run_id=run_id)
    other = runs.run_job(conn, run_id=run_id)
    if other is not None and other != job_id:
        raise Conflict(f"run {run_id} is the result of job {other}")
    if owner is not None and not runs.uploaded_by(conn, run_id=run_id, token_id=owner):
        raise Forbidden(f"run {run_id} was not uploaded by this runner's token")


MAX_FREE_RELEASES = 3
"""Releases a job gets without using up an attempt; later ones count (claim/release cycles
end when ``max_attempts`` is used)."""


def release_job(
    conn: Conn, job_id: int, *, runner: str | None = None, owner: int | None = None
) -> None:
    """Give a held job back to the queue without using up an attempt."""
    c = _j.c
    counted = c.releases >= MAX_FREE_RELEASES
    with transaction(conn):
        job = _held(conn, job_id, runner, owner)
        execute(
            conn,
            sa.update(_j)
            .where(c.id == job_id)
            .values(
                status=sa.case(
                    (sa.and_(counted, c.attempts >= c.max_attempts), "failed"), else_="queued"
                ),
                runner=None,
                lease_expires_at=None,
                attempts=sa.case(
                    (counted, c.attempts),
                    else_=sa.case((c.attempts > 0, c.attempts - 1), else_=0),
                ),
                releases=c.releases + 1,
                reason=f"released by runner {job['runner']!r}",
                updated_at=now_iso(),
            ),
        )
        touch_runner(conn, job["runner"], job_id=None)


def delete_job(conn: Conn, *, job_id: int) -> None:
    """Delete a job (run it inside the caller's transaction); the run it produced stays,
    without its job link. :raises NotFound: no such job."""
    if execute(conn, sa.select(_j.c.id).where(_j.c.id == job_id)).first() is None:
        raise NotFound(f"job {job_id} does not exist")
    runs.unlink_job(conn, job_id=job_id)
    execute(
        conn,
        sa.update(_r).where(_r.c.current_job_id == job_id).values(current_job_id=None),
    )
    execute(conn, sa.delete(_j).where(_j.c.id == job_id))
