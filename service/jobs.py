"""The workload job queue runners pull from: claim with a lease, heartbeat, finish, requeue.

A claim is one conditional ``UPDATE ... WHERE status = 'queued'`` inside ``BEGIN IMMEDIATE``,
so two runners can never both get a job. An expired lease puts the job back in the queue until
``max_attempts`` claims were used; then it fails with the reason. Every function takes a
connection and is meant to run on the writer (``Database.write``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from service.auth import now_iso
from service.core.errors import Conflict, Forbidden, NotFound
from service.storage import runs
from service.storage.database import immediate, one, rows

PUBLIC_COLUMNS = (
    "id, name, gpus, status, attempts, max_attempts, runner, lease_expires_at, run_id, reason, "
    "created_at, updated_at"
)


def submit_job(
    conn: sqlite3.Connection,
    *,
    spec: dict[str, Any],
    spec_yaml: str | None,
    name: str,
    gpus: int,
    max_attempts: int,
) -> int:
    """Queue a validated workload spec."""
    now = now_iso()
    with immediate(conn):
        cur = conn.execute(
            "INSERT INTO jobs (name, spec_json, spec_yaml, gpus, status, attempts, max_attempts, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, 'queued', 0, ?, ?, ?)",
            (name, json.dumps(spec), spec_yaml, gpus, max_attempts, now, now),
        )
    return int(cur.lastrowid or 0)


def submit_checkout_job(
    conn: sqlite3.Connection,
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
    cur = conn.execute(
        "INSERT INTO jobs (name, spec_json, gpus, status, attempts, max_attempts, created_at, "
        "updated_at, batch_id, repo, pr_number, head_sha, base_sha, suite, checkout_json) "
        "VALUES (?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            name,
            json.dumps(spec),
            gpus,
            max_attempts,
            now,
            now,
            batch_id,
            checkout["repo"],
            checkout.get("pr"),
            checkout["sha"],
            checkout.get("base_sha"),
            checkout["suite"],
            json.dumps(checkout),
        ),
    )
    return int(cur.lastrowid or 0)


def batch_jobs(conn: sqlite3.Connection, batch_id: int) -> list[dict[str, Any]]:
    """The jobs of one pull-request batch, in queue order, with their outcome."""
    return rows(
        conn,
        "SELECT id, name, status, run_id, reason, log_tail, spec_json FROM jobs "
        "WHERE batch_id = ? ORDER BY id",
        (batch_id,),
    )


def touch_runner(
    conn: sqlite3.Connection, runner: str, *, gpus: int | None = None, job_id: int | None = None
) -> None:
    """Record that a runner was seen (registration is implicit in its first claim)."""
    now = now_iso()
    conn.execute(
        "INSERT INTO runners (name, gpus, first_seen, last_seen, current_job_id) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET last_seen = excluded.last_seen, "
        "gpus = coalesce(excluded.gpus, runners.gpus), current_job_id = excluded.current_job_id",
        (runner, gpus, now, now, job_id),
    )


def expire_leases(conn: sqlite3.Connection, now: float) -> int:
    """Requeue (or fail, when out of attempts) running jobs whose lease ran out."""
    stale = rows(
        conn,
        "SELECT id, attempts, max_attempts, runner FROM jobs "
        "WHERE status = 'running' AND lease_expires_at < ?",
        (now,),
    )
    for job in stale:
        if job["attempts"] >= job["max_attempts"]:
            reason = (
                f"lease expired on runner {job['runner']!r}; gave up after "
                f"{job['attempts']} attempt(s)"
            )
            conn.execute(
                "UPDATE jobs SET status = 'failed', reason = ?, lease_expires_at = NULL, "
                "updated_at = ? WHERE id = ?",
                (reason, now_iso(), job["id"]),
            )
        else:
            conn.execute(
                "UPDATE jobs SET status = 'queued', runner = NULL, lease_expires_at = NULL,"
                " reason = ?, updated_at = ? WHERE id = ?",
                (f"requeued: lease expired on runner {job['runner']!r}", now_iso(), job["id"]),
            )
    return len(stale)


def claim_job(
    conn: sqlite3.Connection,
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
    with immediate(conn):
        expire_leases(conn, now)
        job = one(
            conn,
            "SELECT id FROM jobs WHERE status = 'queued' AND gpus <= ? ORDER BY id LIMIT 1",
            (gpus,),
        )
        claimed = None
        if job is not None:
            cur = conn.execute(
                "UPDATE jobs SET status = 'running', runner = ?, attempts = attempts + 1, "
                "lease_expires_at = ?, claim_token_id = ?, updated_at = ? "
                "WHERE id = ? AND status = 'queued'",
                (runner, now + lease_s, token_id, now_iso(), job["id"]),
            )
            if cur.rowcount == 1:
                claimed = one(
                    conn,
                    "SELECT id, spec_json, lease_expires_at, checkout_json FROM jobs WHERE id = ?",
                    (job["id"],),
                )
        touch_runner(conn, runner, gpus=gpus, job_id=claimed["id"] if claimed else None)
    if claimed is None:
        return None
    return {
        "id": claimed["id"],
        "spec": json.loads(claimed["spec_json"]),
        "lease_expires_at": claimed["lease_expires_at"],
        "checkout": json.loads(claimed["checkout_json"]) if claimed["checkout_json"] else None,
    }


def _held(
    conn: sqlite3.Connection, job_id: int, runner: str | None, owner: int | None = None
) -> dict[str, Any]:
    """The job, held by a live lease (and, with ``owner``, claimed by that token)."""
    job = one(
        conn,
        "SELECT id, status, runner, lease_expires_at, claim_token_id FROM jobs WHERE id = ?",
        (job_id,),
    )
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
    conn: sqlite3.Connection,
    job_id: int,
    *,
    lease_s: float,
    runner: str | None = None,
    owner: int | None = None,
) -> float:
    """Extend a live lease; :raises Conflict: the lease was lost (the runner must stop);
    :raises Forbidden: ``owner`` (a token id) did not claim the job."""
    with immediate(conn):
        job = _held(conn, job_id, runner, owner)
        expires = time.time() + lease_s
        conn.execute(
            "UPDATE jobs SET lease_expires_at = ?, updated_at = ? WHERE id = ?",
            (expires, now_iso(), job_id),
        )
        touch_runner(conn, job["runner"], job_id=job_id)
    return expires


def finish_job(
    conn: sqlite3.Connection,
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
    with immediate(conn):
        job = _held(conn, job_id, runner, owner)
        if run_id is not None:
            _check_result(conn, job_id, run_id, owner)
        conn.execute(
            "UPDATE jobs SET status = ?, run_id = ?, reason = ?, log_tail = ?, "
            "lease_expires_at = NULL, updated_at = ? WHERE id = ?",
            (status, run_id, reason, (log_tail or "")[-20000:] or None, now_iso(), job_id),
        )
        if run_id is not None:
            runs.link_job(conn, run_id=run_id, job_id=job_id)
        touch_runner(conn, job["runner"], job_id=None)


def _check_result(conn: sqlite3.Connection, job_id: int, run_id: int, owner: int | None) -> None:
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
    conn: sqlite3.Connection, job_id: int, *, runner: str | None = None, owner: int | None = None
) -> None:
    """Give a held job back to the queue without using up an attempt."""
    with immediate(conn):
        job = _held(conn, job_id, runner, owner)
        conn.execute(
            "UPDATE jobs SET status = CASE WHEN releases >= ? AND attempts >= max_attempts"
            " THEN 'failed' ELSE 'queued' END, runner = NULL, lease_expires_at = NULL,"
            " attempts = CASE WHEN releases >= ? THEN attempts ELSE max(attempts - 1, 0) END,"
            " releases = releases + 1, reason = ?, updated_at = ? WHERE id = ?",
            (MAX_FREE_RELEASES, MAX_FREE_RELEASES, f"released by runner {job['runner']!r}",
             now_iso(), job_id),
        )  # fmt: skip
        touch_runner(conn, job["runner"], job_id=None)


def delete_job(conn: sqlite3.Connection, *, job_id: int) -> None:
    """Delete a job (run it inside the caller's transaction); the run it produced stays,
    without its job link. :raises NotFound: no such job."""
    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
        raise NotFound(f"job {job_id} does not exist")
    runs.unlink_job(conn, job_id=job_id)
    conn.execute("UPDATE runners SET current_job_id = NULL WHERE current_job_id = ?", (job_id,))
    conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
