"""Faults against a real ``cptrace serve`` on loopback: killed worker, killed validation
processes, a SIGKILLed server. Each one must show on ``/health`` (503), heal (bounded restarts),
and leave nothing half-written or running."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fault_support import (
    orphan_blobs,
    processes_mentioning,
    record,
    running,
    slow_bundle,
    validation_pids,
    wait_busy,
    wait_quiet,
    watch_health,
    worker_pid,
)
from service_factories import kineto_bundle
from service_server import Server, wait_for

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

FAST = {
    "CPTRACE_RESTART_BACKOFF_S": "3",  # long enough for /health to be seen down
    "CPTRACE_WORKER_HEARTBEAT_S": "0.5",
    "CPTRACE_INGEST_WORKERS": "2",
    # slow_bundle stores ~150 bytes per byte uploaded; the default 100 would refuse it at its
    # first header, before the seconds of validation these tests kill or time out
    "CPTRACE_MAX_STORED_RATIO": "1000",
}


def _upload(server: Server, data: bytes, name: str = "b.tar.gz") -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/v1/uploads/bundles",
        files={"bundle": (name, data)},
        headers=server.headers,
        timeout=120,
    )


def _run_status(server: Server, run_id: int) -> str:
    return str(httpx.get(f"{server.url}/api/v1/runs/{run_id}", timeout=10).json()["status"])


def _component(name: str, state: str | None = None):  # type: ignore[no-untyped-def]
    def check(status: int, body: dict[str, Any]) -> bool:
        part = body["components"][name]
        return status == 200 and (state is None or part["state"] == state)

    return check


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    srv = Server(tmp_path, env=FAST).start()
    try:
        yield srv
    finally:
        srv.kill()


def test_killed_worker_is_restarted_and_queued_work_finishes(tmp_path: Path) -> None:
    # a longer backoff: the upload below must be queued while no worker runs
    server = Server(tmp_path, env={**FAST, "CPTRACE_RESTART_BACKOFF_S": "5"}).start()
    try:
        _killed_worker(server)
    finally:
        server.kill()


def _killed_worker(server: Server) -> None:
    assert server.proc is not None
    watch_health(server.url, _component("worker", "ok"), 30)
    first = wait_for(lambda: worker_pid(server.proc.pid), 30, "the worker process")
    os.kill(first, signal.SIGKILL)
    _status, body, _ = watch_health(
        server.url, lambda s, b: s == 503 and "worker" in b["down"], 10, interval=0.05
    )
    run_id = _upload(server, kineto_bundle(salt="worker-kill")).json()["run_id"]  # queued
    assert body["components"]["worker"]["last_exit"] == "killed by SIGKILL"
    assert str(first) not in str(body)  # no pid in a public answer
    _, body, healed = watch_health(server.url, _component("worker", "ok"), 30)
    assert body["components"]["worker"]["restarts"] == 1
    assert worker_pid(server.proc.pid) not in (None, first)
    assert not Path(f"/proc/{first}").exists()  # reaped by the supervisor, not a zombie
    wait_for(lambda: _run_status(server, run_id) == "analysed", 120, "the queued analysis")
    record(
        "`kill -9` the analysis worker",
        "/health 503 (worker down), worker restarted after the backoff, queued analysis done",
        f"503 with last_exit 'killed by SIGKILL'; healthy again {healed:.1f} s later "
        "(1 restart); the run queued meanwhile analysed",
    )


def test_worker_restarts_are_bounded(tmp_path: Path) -> None:
    env = {**FAST, "CPTRACE_RESTART_MAX": "1", "CPTRACE_RESTART_BACKOFF_S": "0.2"}
    server = Server(tmp_path, env=env).start()
    try:
        assert server.proc is not None
        for _ in range(2):
            watch_health(server.url, _component("worker", "ok"), 30)
            pid = wait_for(lambda: worker_pid(server.proc.pid), 30, "the worker process")
            os.kill(pid, signal.SIGKILL)
        watch_health(server.url, lambda s, b: b["components"]["worker"]["state"] == "failed", 10)
        time.sleep(2)
        status, body, _ = watch_health(server.url, lambda s, b: True, 5)
        assert status == 503 and body["components"]["worker"]["state"] == "failed"
        assert worker_pid(server.proc.pid) is None
    finally:
        server.kill()
    record(
        "the worker dies more often than `CPTRACE_RESTART_MAX` in the window",
        "the server stops restarting it and stays unhealthy",
        "worker state 'failed', /health stays 503, no worker process",
    )


def test_killed_idle_validation_process_is_replaced(server: Server) -> None:
    assert server.proc is not None
    watch_health(server.url, _component("validation", "ok"), 30)
    pids = wait_for(
        lambda: (p := validation_pids(server.proc.pid)) and len(p) == 2 and p, 30, "validators"
    )
    os.kill(pids[0], signal.SIGKILL)
    _, body, _ = watch_health(
        server.url,
        lambda s, b: s == 503 and b["components"]["validation"]["last_exit"] is not None,
        10,
        interval=0.05,
    )
    assert "validation" in body["down"]
    assert body["components"]["validation"]["last_exit"] == "killed by SIGKILL"
    _, body, healed = watch_health(server.url, _component("validation", "ok"), 30)
    assert body["components"]["validation"]["alive"] == 2
    resp = _upload(server, kineto_bundle(salt="after-validator-kill"))
    assert resp.status_code == 201, resp.text
    record(
        "`kill -9` an idle upload-validation process",
        "/health 503 (validation down), process replaced, uploads keep working (no 500)",
        f"503, healthy again {healed:.1f} s later with 2 processes; next upload 201",
    )


def test_validation_process_killed_mid_upload(server: Server) -> None:
    assert server.proc is not None
    watch_health(server.url, _component("validation", "ok"), 30)
    pids = wait_for(
        lambda: (p := validation_pids(server.proc.pid)) and len(p) == 2 and p, 30, "validators"
    )
    big = slow_bundle(300 << 20)  # seconds of inflating and hashing: time to kill it
    wait_quiet(pids)  # so the process that gets busy is the one validating this upload
    answer: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: answer.setdefault("r", _upload(server, big)))
    thread.start()
    busy = wait_busy(pids, 60)
    os.kill(busy, signal.SIGKILL)  # stands in for the OOM killer
    thread.join(timeout=120)
    resp = answer["r"]
    assert resp.status_code == 503, resp.text
    assert "retry" in resp.json()["error"] and str(busy) not in resp.text
    watch_health(server.url, _component("validation", "ok"), 30)
    after = [_upload(server, kineto_bundle(salt=f"after-{i}")).status_code for i in range(3)]
    assert after == [201, 201, 201]
    record(
        "`kill -9` (or OOM kill) of the validation process while it checks an upload",
        "that upload 503 (retry), later uploads work: no BrokenProcessPool 500s",
        f"503 '{resp.json()['error']}'; the next 3 uploads 201",
    )


def test_sigkill_during_validation_leaves_no_orphan_and_no_process(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    # in every child's environment, so a stray one is found whatever its command line
    server = Server(tmp_path, env={**FAST, "CPTRACE_DATA_DIR": data_dir}).start()
    try:
        assert server.proc is not None
        watch_health(server.url, _component("validation", "ok"), 30)
        pids = wait_for(
            lambda: (p := validation_pids(server.proc.pid)) and len(p) == 2 and p, 30, "pool"
        )
        children = [*pids, worker_pid(server.proc.pid)]
        assert None not in children and set(children) <= set(processes_mentioning(data_dir))
        big = slow_bundle(300 << 20)
        wait_quiet(pids)
        threading.Thread(target=lambda: _swallow(lambda: _upload(server, big)), daemon=True).start()
        wait_busy(pids, 60)
        os.kill(server.proc.pid, signal.SIGKILL)  # the server only, not its process group
        server.proc.wait(timeout=30)
        stray = wait_for(
            lambda: not processes_mentioning(data_dir) or None, 15, "the children to end"
        )
        assert stray
        # a child killed mid-validation may still be exiting (its memory already released, so
        # its environment no longer reads): wait for it to end rather than look once
        assert wait_for(
            lambda: not [p for p in children if p is not None and running(p)] or None,
            15,
            "every child to end",
        )
    finally:
        server.kill()
    # A validation that finished its blobs just before the kill leaves files without a row;
    # plant one so the start-up sweep is exercised whatever the timing was.
    planted = tmp_path / "blobs" / "ab" / ("c" * 62)
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"orphan")
    scratch = tmp_path / "tmp" / "analysis-999-12345"
    scratch.mkdir(parents=True, exist_ok=True)
    again = Server(tmp_path, env=FAST).start()
    try:
        assert orphan_blobs(tmp_path) == []
        assert not scratch.exists()
        assert not list((tmp_path / "tmp").glob("part-*"))
    finally:
        again.kill()
    assert "Removed after an unclean stop" in again.log.read_text()
    record(
        "SIGKILL the server while a validation process works",
        "every child ends with it; no blob without a row and no scratch after the restart",
        "no process mentions the data dir within 15 s; restart removed orphan blobs, temp "
        "files and analysis scratch",
    )


def _swallow(fn: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server was killed under it
        fn()


def test_validation_past_its_time_limit_is_413_and_the_process_replaced(tmp_path: Path) -> None:
    env = {**FAST, "CPTRACE_VALIDATION_TIME_LIMIT_S": "1"}
    server = Server(tmp_path, env=env).start()
    try:
        big = _upload(server, slow_bundle(300 << 20))  # inflating and hashing 300 MB: > 1 s
        assert big.status_code == 413, big.text
        assert "validation time limit of 1 s" in big.json()["error"]
        _, body, _ = watch_health(server.url, _component("validation", "ok"), 30)
        assert body["components"]["validation"]["alive"] == 2
        assert body["components"]["validation"]["restarts"] == 0  # replaced, not a crash
    finally:
        server.kill()
    record(
        "an upload whose validation runs past `CPTRACE_VALIDATION_TIME_LIMIT_S` (1 s here)",
        "413 with the reason; the process is replaced at once",
        f"{big.status_code} '{big.json()['error']}'; pool back to 2 processes",
    )
