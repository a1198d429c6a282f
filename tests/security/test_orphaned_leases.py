"""After the API (and its worker) is SIGKILLed, a restarted worker requeues at once the tasks
whose worker process on this host is gone, instead of waiting out the lease (issue 24, item 12).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

from fastapi.testclient import TestClient
from service_factories import auth, kineto_bundle

from service import analysis
from service.auth import Role, create_token
from service.core.config import Settings
from service.main import create_app
from service.storage.database import connect
from service.worker import AnalysisWorker


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_dead_workers_leases_end_on_start_live_and_remote_ones_stay(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", ingest_workers=0, analysis_lease_s=600)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN))
    with TestClient(app) as client:
        for salt in ("a", "b", "c"):
            answer = client.post(
                "/api/v1/uploads/bundles", content=kineto_bundle(name=f"lease-{salt}", salt=salt),
                headers={**auth(token), "Content-Type": "application/gzip"},
            )  # fmt: skip
            assert answer.status_code == 201, answer.text
    host = socket.gethostname()
    conn = connect(settings.db_path, busy_timeout_ms=settings.busy_timeout_ms)
    holders = [f"{host}:{_dead_pid()}", f"{host}:{os.getpid()}", "elsewhere:1"]
    claimed = [
        analysis.claim_analysis(conn, worker=w, lease_s=600, max_attempts=3) for w in holders
    ]
    assert all(t is not None for t in claimed)
    assert analysis.claim_analysis(conn, worker="new", lease_s=600, max_attempts=3) is None
    dead = claimed[0]
    assert dead is not None
    # A worker starting now (as after a restart) requeues the dead one's task at once and runs
    # it; the live and the other host's tasks keep their leases.
    worker = AnalysisWorker(settings)
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while _status(conn, dead.id) != "done" and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.stop.set()
        thread.join(timeout=30)
        worker.close()
    assert _status(conn, dead.id) == "done"
    assert [_status(conn, t.id) for t in claimed[1:] if t is not None] == ["running"] * 2
    assert analysis.expire_orphaned_leases(conn, host=host) == []
    conn.close()


def _status(conn: sqlite3.Connection, task_id: int) -> str:
    row = conn.execute("SELECT status FROM analysis_tasks WHERE id = ?", (task_id,)).fetchone()
    return str(row[0])
