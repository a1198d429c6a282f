"""A large stored report is streamed: three concurrent GETs of a 40 MB report cost the API
process less memory than one copy of it (issue 24, item 6: three anonymous GETs of a 92 MB
report took the API to 949 MB when each was parsed into the model and written out again).

Against a real ``cptrace serve``: a run uploaded through the API, its report (a real analysis
of the synthetic traces, grown with notes to 40 MB) stored in its row as the worker stores
it; the API process's peak resident memory is read from ``/proc`` around the GETs.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_factories import KINETO_RANK0, KINETO_RANK1, kineto_bundle
from service_server import Server

from analyzers import analyze

REPORT_BYTES = 40 * 1024 * 1024

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads peak memory from Linux /proc"
)


@pytest.fixture(scope="module")
def large_report() -> str:
    report = analyze([KINETO_RANK0, KINETO_RANK1])
    note = "a note of the size of a long kernel name " * 100
    report.notes = [note] * (REPORT_BYTES // len(note))
    return report.model_dump_json()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path, worker=False).start()
    try:
        yield srv
    finally:
        srv.stop()


def _store(server: Server, text: str) -> int:
    answer = httpx.post(
        f"{server.url}/api/v1/uploads/bundles", content=kineto_bundle(name="large"),
        headers={**server.headers, "Content-Type": "application/gzip"}, timeout=60,
    )  # fmt: skip
    assert answer.status_code == 201, answer.text
    run_id = int(answer.json()["run_id"])
    conn = sqlite3.connect(server.data_dir / "cptrace.db")
    with conn:
        conn.execute(
            "INSERT INTO reports (run_id, schema_version, catalog_version, report_json, "
            "duration_s, created_at) VALUES (?, 1, 'test', ?, 1.0, '2026-01-01T00:00:00Z')",
            (run_id, text),
        )
    conn.close()
    return run_id


def _peak_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))


def test_three_concurrent_gets_of_a_large_report_stay_bounded(
    server: Server, large_report: str
) -> None:
    run_id = _store(server, large_report)
    assert server.proc is not None
    pid = server.proc.pid
    url = f"{server.url}/api/v1/runs/{run_id}/analysis/result"
    httpx.get(f"{server.url}/api/v1/runs/{run_id}", timeout=30).raise_for_status()  # warm
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # restart the peak at the current size
    before = _peak_kib(pid)
    digests: list[str] = []

    def get() -> None:
        digest = hashlib.sha256()
        with httpx.stream("GET", url, timeout=120) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"] == "application/json"
            assert int(answer.headers["content-length"]) == len(large_report.encode())
            for chunk in answer.iter_bytes():
                digest.update(chunk)
        digests.append(digest.hexdigest())

    readers = [threading.Thread(target=get) for _ in range(3)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=120)
    grown = (_peak_kib(pid) - before) * 1024
    # every reader got the stored report byte for byte
    assert digests == [hashlib.sha256(large_report.encode()).hexdigest()] * 3
    assert grown < len(large_report) / 2, f"the API grew {grown / 1e6:.0f} MB"
