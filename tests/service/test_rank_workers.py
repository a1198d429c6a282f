"""Workers sharing one multi-rank run, on SQLite and on PostgreSQL: real ``cptrace worker``
processes on one database and one blob store take a 4-rank run's rank tasks between them (each
rank done once), a worker SIGKILLed mid rank task leaves that rank to run again once after its
lease ends, and the stored report is the one-process analysis' byte for byte both times, its
part blobs gone from the store afterwards."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from service_factories import KINETO_RANK0, KINETO_RANK1, manifest_for, tar_gz
from service_server import wait_for

from analyzers.manifest import parse_manifest
from analyzers.pipeline import analyze
from analyzers.readers import TraceInput
from service.auth import Role, create_token
from service.core.config import Settings
from service.main import create_app
from service.storage import runs, schema, tasks
from service.storage.blob_rows import recorded_digests
from service.storage.blobs import open_blobs
from service.storage.engine import AnyDatabase, Backend, execute

RANKS = 4


def _rank_files(folder: Path) -> list[tuple[str, bytes, str, int]]:
    """The synthetic pair as ``RANKS`` ranks (each copy's ``distributedInfo`` rewritten)."""
    pair = [json.loads(gzip.decompress(p.read_bytes())) for p in (KINETO_RANK0, KINETO_RANK1)]
    out = []
    for rank in range(RANKS):
        trace = dict(pair[rank % 2])
        info = {**trace["distributedInfo"], "rank": rank, "world_size": RANKS}
        trace["distributedInfo"] = info
        data = gzip.compress(json.dumps(trace).encode(), compresslevel=1)
        (folder / f"rank{rank}.json.gz").write_bytes(data)
        out.append((f"traces/rank{rank}.json.gz", data, "kineto", rank))
    return out


class _Service:
    """The database and blob store the workers share, an API in-process for the upload."""

    def __init__(self, tmp: Path, backend: Backend, request: pytest.FixtureRequest) -> None:
        self.tmp = tmp
        self.url = ""
        if backend is Backend.POSTGRESQL:
            self.url = request.getfixturevalue("postgres").new_database()
        self.settings = Settings(data_dir=tmp / "data", ingest_workers=0, database_url=self.url)
        self.app = create_app(self.settings)
        self.db: AnyDatabase = self.app.state.db
        self.workers: list[subprocess.Popen[bytes]] = []

    def worker(self, lease_s: float = 600) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"worker{len(self.workers)}.log").open("wb")
        database = ["--database", self.url] if self.url else []
        env = {
            **os.environ,
            "CPTRACE_WORKER_POLL_S": "0.1",
            "CPTRACE_ANALYSIS_RANK_WORKERS": "1",
            "CPTRACE_ANALYSIS_PER_RANK_MIN_BYTES": "0",
            "CPTRACE_ANALYSIS_LEASE_S": str(lease_s),
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", "from cptrace.cli import main; main()", "worker",
             "--data-dir", str(self.settings.data_dir), *database],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
        self.workers.append(proc)
        return proc

    def wait_workers_alive(self, count: int) -> None:
        beats = sa.select(sa.func.count()).select_from(schema.worker_heartbeats)
        wait_for(
            lambda: self.db.read(lambda c: execute(c, beats).scalar()) >= count,
            60,
            f"{count} workers to start",
            interval=0.1,
        )

    def upload(self, traces: list[tuple[str, bytes, str, int]]) -> tuple[int, Any]:
        manifest = manifest_for(traces)
        bundle = tar_gz([("manifest.json", json.dumps(manifest).encode())] + [
            (path, data) for path, data, _, _ in traces
        ])  # fmt: skip
        token = self.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
        with TestClient(self.app) as client:
            resp = client.post(
                "/api/v1/uploads/bundles",
                files={"bundle": ("b.tar.gz", bundle)},
                headers={"Authorization": f"Bearer {token}"},
            )
        assert resp.status_code == 201, resp.text
        return int(resp.json()["run_id"]), parse_manifest(manifest, source="manifest.json")

    def tasks(self) -> list[dict[str, Any]]:
        t = schema.analysis_tasks
        query = sa.select(t.c.kind, t.c.part, t.c.status, t.c.attempts, t.c.worker).order_by(t.c.id)
        return self.db.read(lambda c: execute(c, query).rows)

    def wait_analysed(self, run_id: int) -> str:
        def analysed() -> bool:
            (run,) = self.db.read(
                lambda c: execute(c, sa.select(schema.runs.c.status, schema.runs.c.error)).rows
            )
            assert run["status"] != "failed", (run, self.logs())
            return bool(run["status"] == "analysed")

        wait_for(analysed, 120, "the workers to analyse the run", interval=0.2)
        text = self.db.read(lambda c: runs.report_json(c, run_id=run_id))
        assert text is not None
        return text

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.tmp.glob("worker*.log")))

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        self.db.close()


@pytest.fixture(params=[Backend.SQLITE, Backend.POSTGRESQL], ids=str)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Service]:
    shared = _Service(tmp_path, request.param, request)
    yield shared
    shared.close()


def _one_process(folder: Path, traces: list[tuple[str, bytes, str, int]], manifest: Any) -> str:
    inputs = [
        TraceInput(path=folder / f"rank{r}.json.gz", format="kineto", gzipped=True, rank=r,
                   label=name)
        for name, _, _, r in traces
    ]  # fmt: skip
    return analyze(inputs, manifest=manifest).model_dump_json()


def _parts_reclaimed(service: _Service) -> None:
    # The merge's worker deletes the parts after it stores the report (and the run's page), so
    # the run reads "analysed" a moment before its parts are gone: wait for that, bounded.
    wait_for(
        lambda: service.db.read(tasks.recorded_parts) == set(), 30, "the parts to be reclaimed"
    )
    store = open_blobs(service.settings.blob_location, service.settings.tmp_dir)
    assert set(store.iter_digests()) == service.db.read(recorded_digests)  # uploads' only


@pytest.mark.timeout(240)
def test_two_workers_share_a_runs_rank_tasks_each_done_once(
    service: _Service, tmp_path: Path
) -> None:
    traces = _rank_files(tmp_path)
    service.worker()
    service.worker()
    service.wait_workers_alive(2)
    run_id, manifest = service.upload(traces)
    report = service.wait_analysed(run_id)
    rows = service.tasks()
    ranks = [r for r in rows if r["kind"] == "rank"]
    assert [(r["part"], r["status"], r["attempts"]) for r in ranks] == [
        (i, "done", 1) for i in range(RANKS)
    ]
    assert len({r["worker"] for r in ranks}) == 2, service.logs()  # both took rank tasks
    assert [(r["kind"], r["status"]) for r in rows if r["kind"] != "rank"] == [("merge", "done")]
    assert report == _one_process(tmp_path, traces, manifest)
    _parts_reclaimed(service)


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_rank_task_leaves_that_rank_to_run_once_more(
    service: _Service, tmp_path: Path
) -> None:
    traces = _rank_files(tmp_path)
    victim = service.worker(lease_s=3)
    service.wait_workers_alive(1)
    run_id, manifest = service.upload(traces)

    def rank_running() -> bool:
        return any(r["kind"] == "rank" and r["status"] == "running" for r in service.tasks())

    wait_for(rank_running, 60, "a rank task to start", interval=0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # the worker and its analysis child
    victim.wait(timeout=10)
    killed = {r["part"] for r in service.tasks() if r["status"] == "running"}
    assert len(killed) == 1
    service.worker(lease_s=3)
    report = service.wait_analysed(run_id)
    ranks = [r for r in service.tasks() if r["kind"] == "rank"]
    assert all(r["status"] == "done" for r in ranks)
    assert {r["part"]: r["attempts"] for r in ranks} == {
        i: 2 if i in killed else 1 for i in range(RANKS)
    }
    assert report == _one_process(tmp_path, traces, manifest)
    _parts_reclaimed(service)
