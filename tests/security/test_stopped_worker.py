"""A SIGSTOPped analysis worker is not only reported down: the supervisor kills and restarts
it once it has been silent past ``CPTRACE_HEALTH_WORKER_STALE_S`` (issue 24, item 15)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
from pathlib import Path

import pytest
from service_server import Server, wait_for

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _worker_pid(server: Server) -> int | None:
    assert server.proc is not None
    tasks = Path(f"/proc/{server.proc.pid}/task").glob("*/children")  # the spawning thread's
    for pid in (p for task in tasks for p in task.read_text().split()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b".worker" in cmdline:  # service.worker, or cptrace.worker as served
            return int(pid)
    return None


def _beats(data_dir: Path, pid: int) -> bool:
    with sqlite3.connect(data_dir / "cptrace.db") as conn:
        name = f"{socket.gethostname()}:{pid}"
        sql = "SELECT 1 FROM worker_heartbeats WHERE name = ?"
        return conn.execute(sql, (name,)).fetchone() is not None


def test_a_stopped_worker_is_restarted(tmp_path: Path) -> None:
    env = {"CPTRACE_HEALTH_WORKER_STALE_S": "3", "CPTRACE_WORKER_HEARTBEAT_S": "0.3",
           "CPTRACE_RESTART_BACKOFF_S": "0.1", "GITHUB_TOKEN": ""}  # fmt: skip
    server = Server(tmp_path, env=env).start()
    stopped: int | None = None
    try:
        first = wait_for(lambda: _worker_pid(server), 30, "the worker process")
        wait_for(lambda: _beats(tmp_path, first), 30, "the worker's first heartbeat")
        os.kill(first, signal.SIGSTOP)
        stopped = first
        second = wait_for(
            lambda: (pid if (pid := _worker_pid(server)) not in (None, first) else None),
            30, "a restarted worker",
        )  # fmt: skip
        assert second != first
        assert not Path(f"/proc/{first}").exists() or b"Z" in Path(
            f"/proc/{first}/stat"
        ).read_bytes().split(b")")[-1][:3], "the stopped worker was killed"
        stopped = None
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        server.stop()
