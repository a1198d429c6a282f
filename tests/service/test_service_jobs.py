"""The job queue: submit/validate, claim exclusivity, heartbeats, lease expiry, finish, release."""

from __future__ import annotations

import functools
import threading
import time

import pytest
from fastapi.testclient import TestClient
from queue_store import QueueStore, rows_of
from service_factories import SPEC_YAML

from service import jobs
from service.storage import schema
from service.storage.database import Database
from service.storage.engine import PostgresDatabase

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _submit(client: TestClient, admin: dict[str, str], **extra: object) -> dict:
    resp = client.post("/api/v1/jobs", json={"spec_yaml": SPEC_YAML, **extra}, headers=admin)
    assert resp.status_code == 201, resp.text
    return resp.json()


def _drain(client: TestClient, runner: dict[str, str]) -> None:
    """Finish whatever an earlier test left queued (tests share the module's database)."""
    for _ in range(50):
        resp = client.post("/api/v1/jobs/claim", json={"runner": "r1"}, headers=runner)
        if resp.status_code == 204:
            return
        client.post(
            f"/api/v1/jobs/{resp.json()['id']}/fail", json={"reason": "drain"}, headers=runner
        )


def test_submit_validates_the_spec(
    client: TestClient, admin: dict[str, str], runner: dict[str, str]
) -> None:
    job = _submit(client, admin)
    assert job["status"] == "queued" and job["name"] == "test-job"
    assert job["spec"]["seqlens"] == [256, 128]
    bad = client.post(
        "/api/v1/jobs", json={"spec_yaml": SPEC_YAML + "pad_between_seq: false\n"}, headers=admin
    )
    assert bad.status_code == 422 and "pad_between_seq" in bad.json()["error"]
    broken = client.post("/api/v1/jobs", json={"spec_yaml": "name: [unclosed"}, headers=admin)
    assert broken.status_code == 400 and "YAML" in broken.json()["error"]
    both = client.post("/api/v1/jobs", json={"spec_yaml": SPEC_YAML, "spec": {}}, headers=admin)
    assert both.status_code == 400
    assert (
        client.post("/api/v1/jobs", json={"spec_yaml": SPEC_YAML}, headers=runner).status_code
        == 403
    )
    _drain(client, runner)


def test_claim_heartbeat_complete(
    client: TestClient, admin: dict[str, str], runner: dict[str, str]
) -> None:
    _drain(client, runner)
    job = _submit(client, admin, gpus=2)
    small = client.post("/api/v1/jobs/claim", json={"runner": "r1", "gpus": 1}, headers=runner)
    assert small.status_code == 204  # needs 2 GPUs
    claimed = client.post("/api/v1/jobs/claim", json={"runner": "r1", "gpus": 8}, headers=runner)
    assert claimed.status_code == 200
    body = claimed.json()
    assert body["id"] == job["id"] and body["spec"]["name"] == "test-job"
    beat = client.post(f"/api/v1/jobs/{job['id']}/heartbeat", json={}, headers=runner)
    assert beat.status_code == 200 and beat.json()["lease_expires_at"] >= body["lease_expires_at"]
    run = client.post("/api/v1/runs", json={"name": "from-job"}, headers=runner).json()
    done = client.post(
        f"/api/v1/jobs/{job['id']}/complete", json={"run_id": run["id"]}, headers=runner
    )
    assert done.status_code == 200
    final = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert final["status"] == "completed" and final["run_id"] == run["id"]
    lost = client.post(f"/api/v1/jobs/{job['id']}/heartbeat", json={}, headers=runner)
    assert lost.status_code == 409
    assert client.post("/api/v1/jobs/999999/heartbeat", json={}, headers=runner).status_code == 404
    runners = client.get("/api/v1/runners").json()
    assert any(r["name"] == "r1" and r["gpus"] == 8 for r in runners)


def test_fail_and_release(
    client: TestClient, admin: dict[str, str], runner: dict[str, str]
) -> None:
    _drain(client, runner)
    job = _submit(client, admin)
    first = client.post("/api/v1/jobs/claim", json={"runner": "r1"}, headers=runner).json()
    assert (
        client.post(f"/api/v1/jobs/{first['id']}/release", json={}, headers=runner).status_code
        == 200
    )
    again = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert again["status"] == "queued" and again["attempts"] == 0
    second = client.post("/api/v1/jobs/claim", json={"runner": "r1"}, headers=runner).json()
    assert second["id"] == job["id"]
    fail = client.post(
        f"/api/v1/jobs/{job['id']}/fail",
        json={"reason": "CUDA OOM", "log_tail": "...out of memory"},
        headers=runner,
    )
    assert fail.status_code == 200
    final = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert final["status"] == "failed" and final["reason"] == "CUDA OOM"
    assert final["log_tail"].endswith("out of memory")


def test_submitted_specs_refuse_aliases_and_are_capped(
    client: TestClient, admin: dict[str, str]
) -> None:
    """A 504-byte YAML alias bomb expanded to a 58 MB job spec that slowed every job read; an
    admin's spec follows the pull-request loop's rules: no aliases, 64 KiB as JSON."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    resp = client.post("/api/v1/jobs", json={"spec_yaml": SPEC_YAML + bomb}, headers=admin)
    assert resp.status_code == 400 and "aliases" in resp.json()["error"]
    padded = SPEC_YAML + "notes: " + "x" * 70_000 + "\n"
    resp = client.post("/api/v1/jobs", json={"spec_yaml": padded}, headers=admin)
    assert resp.status_code == 413 and "65536-byte limit" in resp.json()["error"]
    big = {"spec": {"name": "test-job", "notes": "x" * 70_000}}
    assert client.post("/api/v1/jobs", json=big, headers=admin).status_code == 413


def test_admin_deletes_a_job_in_any_state(
    client: TestClient, admin: dict[str, str], runner: dict[str, str], viewer: dict[str, str]
) -> None:
    _drain(client, runner)
    queued = _submit(client, admin, name="to-delete")
    assert client.delete(f"/api/v1/jobs/{queued['id']}", headers=runner).status_code == 403
    assert client.delete(f"/api/v1/jobs/{queued['id']}", headers=viewer).status_code == 403
    assert client.delete(f"/api/v1/jobs/{queued['id']}").status_code == 401
    gone = client.delete(f"/api/v1/jobs/{queued['id']}", headers=admin)
    assert gone.status_code == 200 and gone.json()["ok"] is True
    assert client.get(f"/api/v1/jobs/{queued['id']}").status_code == 404
    assert queued["id"] not in {j["id"] for j in client.get("/api/v1/jobs").json()}
    nothing = client.post("/api/v1/jobs/claim", json={"runner": "r1"}, headers=runner)
    assert nothing.status_code == 204
    again = client.delete(f"/api/v1/jobs/{queued['id']}", headers=admin)
    assert again.status_code == 404 and f"job {queued['id']} does not exist" in again.text
    # a completed job's run stays, without the link; a running job's runner loses it (404)
    done = _submit(client, admin)
    claimed = client.post("/api/v1/jobs/claim", json={"runner": "r1"}, headers=runner).json()
    run = client.post("/api/v1/runs", json={"name": "from-deleted-job"}, headers=runner).json()
    client.post(f"/api/v1/jobs/{claimed['id']}/complete", json={"run_id": run["id"]},
                headers=runner).raise_for_status()  # fmt: skip
    assert client.delete(f"/api/v1/jobs/{done['id']}", headers=admin).status_code == 200
    assert client.get(f"/api/v1/runs/{run['id']}").status_code == 200
    running = _submit(client, admin)
    client.post("/api/v1/jobs/claim", json={"runner": "r1"}, headers=runner).raise_for_status()
    assert client.delete(f"/api/v1/jobs/{running['id']}", headers=admin).status_code == 200
    beat = client.post(f"/api/v1/jobs/{running['id']}/heartbeat", json={}, headers=runner)
    assert beat.status_code == 404


def test_long_poll_waits_then_204(client: TestClient, runner: dict[str, str]) -> None:
    _drain(client, runner)
    started = time.monotonic()
    resp = client.post("/api/v1/jobs/claim", json={"runner": "r1", "wait_s": 0.6}, headers=runner)
    assert resp.status_code == 204
    assert 0.5 <= time.monotonic() - started < 5


def test_concurrent_claims_never_share_a_job(queue_store: QueueStore) -> None:
    """8 threads, each with its own database handle (as 8 runner requests across API processes
    would), on SQLite and on PostgreSQL (FOR UPDATE SKIP LOCKED)."""
    db = queue_store.open()
    ids = [
        db.write(
            lambda c, i=i: jobs.submit_job(
                c, spec={"name": f"j{i}"}, spec_yaml=None, name=f"j{i}", gpus=0, max_attempts=3
            )
        )
        for i in range(40)
    ]
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(8)

    def work(name: str, own: Database | PostgresDatabase) -> None:
        barrier.wait()
        mine = got.setdefault(name, [])
        claim = functools.partial(jobs.claim_job, runner=name, gpus=0, lease_s=60)
        while (job := own.write(claim)) is not None:
            mine.append(job["id"])
            time.sleep(0.002)  # "run" the job, letting the other runners in

    threads = [
        threading.Thread(target=work, args=(f"runner{i}", queue_store.open())) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    claimed = [j for ids in got.values() for j in ids]
    assert sorted(claimed) == ids  # every job exactly once
    assert sum(1 for ids in got.values() if ids) > 1  # really concurrent


def test_expired_lease_requeues_then_fails(queue_store: QueueStore) -> None:
    db = queue_store.open()
    job_id = db.write(
        lambda c: jobs.submit_job(
            c, spec={"name": "x"}, spec_yaml=None, name="x", gpus=0, max_attempts=2
        )
    )
    first = db.write(lambda c: jobs.claim_job(c, runner="dead", gpus=0, lease_s=0.05))
    assert first is not None and first["id"] == job_id
    time.sleep(0.1)
    second = db.write(lambda c: jobs.claim_job(c, runner="alive", gpus=0, lease_s=0.05))
    assert second is not None and second["id"] == job_id  # requeued for another runner
    (row,) = rows_of(db, schema.jobs, "attempts", "runner")
    assert row == {"attempts": 2, "runner": "alive"}
    time.sleep(0.1)
    assert db.write(lambda c: jobs.claim_job(c, runner="third", gpus=0, lease_s=60)) is None
    (row,) = rows_of(db, schema.jobs, "status", "reason")
    assert row["status"] == "failed" and "lease expired" in row["reason"]
    assert "2 attempt" in row["reason"]
