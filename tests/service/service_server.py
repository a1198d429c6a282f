"""A real ``cptrace serve`` on loopback in its own process group, for crash and load tests."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from testkit import free_port


class Server:
    """``cptrace serve`` (API + worker subprocess) over ``data_dir``; SIGKILL-able as a group."""

    def __init__(
        self,
        data_dir: Path,
        *,
        worker: bool = True,
        env: dict[str, str] | None = None,
        database: str | None = None,
    ):
        self.data_dir = data_dir
        self.database = database  # a postgresql:// URL; None: SQLite in data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker = worker
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.admin_token: str | None = None
        self.log = data_dir / f"server-{self.port}.log"

    def start(self, timeout: float = 60) -> Server:
        args = [
            sys.executable,
            "-c",
            "from cptrace.cli import main; main()",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
        ]
        if not self.worker:
            args.append("--no-worker")
        if self.database is not None:
            args += ["--database", self.database]
        self.proc = subprocess.Popen(
            args,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            self.kill()
            raise RuntimeError(f"server did not start: {self.log.read_text()}")
        found = re.search(r"Admin token \(shown once, stored hashed\): (\S+)", self.log.read_text())
        if found:
            self.admin_token = found.group(1)
        return self

    @property
    def headers(self) -> dict[str, str]:
        assert self.admin_token, "the admin token is printed on the first start only"
        return {"Authorization": f"Bearer {self.admin_token}"}

    def kill(self) -> None:
        """SIGKILL the server and its worker: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Graceful stop (SIGINT to uvicorn, which then stops the worker)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_worker(
    data_dir: Path, database: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``cptrace worker`` on ``database`` in its own process group (its log in ``data_dir``);
    ``env`` adds settings (e.g. the S3 blob store's) to the inherited environment."""
    log = (data_dir / "worker.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-c", "from cptrace.cli import main; main()", "worker",
         "--data-dir", str(data_dir), "--database", database],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "CPTRACE_WORKER_POLL_S": "0.1", **(env or {})},
    )  # fmt: skip


def upload_bundle(server: Server, bundle: Path) -> int:
    """``bundle`` uploaded with the server's token (201 asserted); its run id."""
    answer = httpx.post(
        f"{server.url}/api/v1/uploads/bundles",
        files={"bundle": (bundle.name, bundle.read_bytes())},
        headers=server.headers,
        timeout=60,
    )
    assert answer.status_code == 201, answer.text
    return int(answer.json()["run_id"])


def wait_analysed(server: Server, run_id: int, what: str, timeout: float = 60) -> None:
    """Poll the run over HTTP until it is analysed; a failed run fails at once, with its error."""

    def analysed() -> bool:
        run = httpx.get(f"{server.url}/api/v1/runs/{run_id}", timeout=10).json()
        assert run["status"] != "failed", (run["error"], run["progress"])
        return bool(run["status"] == "analysed")

    wait_for(analysed, timeout, what, interval=0.2)


def group_alive(server: Server) -> bool:
    """Whether any process of the server's group (API or worker) still exists."""
    assert server.proc is not None
    try:
        os.killpg(server.proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def db_state(data_dir: Path) -> dict[str, Any]:
    """Integrity and visible rows, read straight from the file (no server code involved)."""
    conn = sqlite3.connect(data_dir / "cptrace.db")
    try:
        return {
            "integrity": conn.execute("PRAGMA integrity_check").fetchone()[0],
            "runs": conn.execute("SELECT count(*) FROM runs").fetchone()[0],
            "run_files": conn.execute("SELECT count(*) FROM run_files").fetchone()[0],
            "reports": conn.execute("SELECT count(*) FROM reports").fetchone()[0],
            "statuses": [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY id")],
        }
    finally:
        conn.close()


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
