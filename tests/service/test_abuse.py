"""Hostile input against a real ``cptrace serve`` on loopback: an expanding upload under a
memory cap, inputs that used to answer 500, extreme timestamps, huge names, slow clients.
Every answer is 2xx/4xx, never 5xx, and nothing is left behind."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fault_support import (
    expanding_bundle,
    orphan_blobs,
    peak_rss_bytes,
    record,
    validation_pids,
    wait_busy,
    wait_quiet,
)
from service_factories import (
    KINETO_RANK0,
    NSYS_SINGLE,
    bundle_with,
    kineto_bundle,
    manifest_for,
    tar_gz,
)
from service_server import Server, wait_for

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

MiB = 1024 * 1024
VALIDATION_LIMIT = 768 * MiB
SMALL_UPLOAD_MAX_S = 20.0  # a small upload beside a big one is answered within this
TIMEOUT_S = 2.0
ANALYSIS_LIMIT_S = 60
ENV = {
    "CPTRACE_INGEST_WORKERS": "2",
    "CPTRACE_VALIDATION_MEMORY_LIMIT_BYTES": str(VALIDATION_LIMIT),
    "CPTRACE_HTTP_HEADER_TIMEOUT_S": str(TIMEOUT_S),
    "CPTRACE_HTTP_BODY_TIMEOUT_S": str(TIMEOUT_S),
    # hostile traces must not burn the shared CI machine for the default 30 minutes / 16 GiB
    "CPTRACE_ANALYSIS_TIME_LIMIT_S": str(ANALYSIS_LIMIT_S),
    "CPTRACE_ANALYSIS_MEMORY_LIMIT_BYTES": str(2048 * MiB),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("abuse"), env=ENV).start()
    try:
        yield srv
    finally:
        srv.kill()


def _post(server: Server, route: str, files: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/v1/uploads/{route}",
        files=files,
        headers=server.headers,
        timeout=180,
        **kw,
    )


def _nothing_left(server: Server) -> None:
    assert orphan_blobs(server.data_dir) == []
    assert not list((server.data_dir / "tmp").glob("part-*"))


def _analysed(server: Server, run_id: int) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run = httpx.get(f"{server.url}/api/v1/runs/{run_id}", timeout=10).json()
        return run if run["status"] in ("analysed", "failed") else None

    return wait_for(done, ANALYSIS_LIMIT_S + 120, f"run {run_id} to be analysed")  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("attack", "route", "files", "data", "headers", "expected"),
    [
        ("rank=² in the form", "traces", {"trace": ("t.json.gz", b"x")}, {"rank": "²"}, {}, 400),
        (
            "rank=2^63 in the form",
            "traces",
            {"trace": ("t.json.gz", b"x")},
            {"rank": str(2**63)},
            {},
            400,
        ),
    ],
    ids=["rank-superscript", "rank-2^63-form"],
)
def test_form_fields_out_of_range_are_400(
    server: Server, attack: str, route: str, files: Any, data: Any, headers: Any, expected: int
) -> None:
    files = {"trace": ("t.json.gz", KINETO_RANK0.read_bytes())}
    resp = _post(server, route, files, data=data)
    assert resp.status_code == expected, resp.text
    assert "rank" in resp.json()["error"]
    _nothing_left(server)
    record(attack, f"{expected}, no orphan blob", f"{resp.status_code} '{resp.json()['error']}'")


def test_manifest_rank_2_63_is_422(server: Server) -> None:
    data = KINETO_RANK0.read_bytes()
    traces = [("traces/rank0.json.gz", data, "kineto", 2**63)]
    manifest = manifest_for(traces)
    bundle = tar_gz(
        [("manifest.json", json.dumps(manifest).encode()), ("traces/rank0.json.gz", data)]
    )
    resp = _post(server, "bundles", {"bundle": ("b.tar.gz", bundle)})
    assert resp.status_code == 422, resp.text
    _nothing_left(server)
    record(
        "trace rank 2^63 in a bundle manifest",
        "422 before SQLite, no orphan blob",
        f"{resp.status_code} '{resp.json()['error']}'",
    )


def test_long_multipart_boundary_is_400(server: Server) -> None:
    boundary = "b" * 300
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="bundle"; filename="b.tar.gz"'
        f"\r\n\r\n".encode()
        + kineto_bundle(salt="boundary")
        + f"\r\n--{boundary}--\r\n".encode()
    )
    resp = httpx.post(
        f"{server.url}/api/v1/uploads/bundles",
        content=body,
        headers={**server.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    assert "boundary" in resp.json()["error"]
    _nothing_left(server)
    record(
        "a multipart boundary of 300 characters",
        "400, no temp file or blob",
        f"{resp.status_code} '{resp.json()['error']}'",
    )


def _extreme_export(tmp: Path, mode: str) -> bytes:
    path = tmp / f"extreme-{mode}.sqlite"
    path.write_bytes(gzip.decompress(NSYS_SINGLE.read_bytes()))
    conn = sqlite3.connect(path)
    first = "(SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
    if mode == "span":  # one kernel spanning the whole int64 range
        conn.execute(
            f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = {-(2**63)}, end = {2**63 - 1} "
            f"WHERE rowid = {first}"
        )
    elif mode == "shifted-up":  # every timestamp pushed to the top of int64 (and past it)
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
            conn.execute(
                f"UPDATE {table} SET start = start + 9223372036000000000, "
                "end = end + 9223372036000000000"
            )
    elif mode == "shifted-down":
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
            conn.execute(
                f"UPDATE {table} SET start = start - 9223372036000000000, "
                "end = end - 9223372036000000000"
            )
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("mode", ["span", "shifted-up", "shifted-down"])
def test_extreme_timestamps_analyse_readably_or_fail_with_a_reason(
    server: Server, tmp_path: Path, mode: str
) -> None:
    name = f"extreme-{mode}.sqlite"
    resp = _post(server, "traces", {"trace": (name, _extreme_export(tmp_path, mode))})
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    run = _analysed(server, run_id)
    pages = {
        path: httpx.get(f"{server.url}{path}", timeout=30).status_code
        for path in (
            f"/api/v1/runs/{run_id}",
            f"/api/v1/runs/{run_id}/analysis/result",
            f"/runs/{run_id}",
            f"/runs/{run_id}.json",
        )
    }
    assert all(code < 500 for code in pages.values()), pages
    if run["status"] == "analysed":
        assert pages[f"/api/v1/runs/{run_id}/analysis/result"] == 200
        observed = "analysed; report, run page and JSON twin load (200)"
    else:
        error = run["error"]
        assert error and str(server.data_dir) not in error and "/tmp/" not in error
        observed = f"failed: '{error[:90]}'"
    record(
        f"nsys export with int64-extreme timestamps ({mode})",
        "a readable report, or a failed analysis with the reason; never a 500 page",
        observed,
    )


def test_failure_reasons_name_the_uploaded_file_not_server_paths(server: Server) -> None:
    # passes the structural check at upload (a list of objects), has no event the reader keeps
    resp = _post(server, "traces", {"trace": ("my-profile.json", b'{"traceEvents": [{"a": 1}]}')})
    assert resp.status_code == 201, resp.text
    run = _analysed(server, resp.json()["run_id"])
    error = run["error"]
    assert run["status"] == "failed" and error
    assert str(server.data_dir) not in error and "analysis-" not in error
    assert "trace000" not in error
    status = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/analysis", timeout=10).json()
    assert str(server.data_dir) not in json.dumps(status)
    record(
        "a trace that fails analysis; its error read without a token",
        "the message names the uploaded file, no server path or pid",
        f"'{error[:100]}'",
    )


def test_huge_kernel_name_is_truncated_in_reports_and_pages(server: Server) -> None:
    trace = json.loads(gzip.decompress(KINETO_RANK0.read_bytes()))
    kernels = sorted(
        (e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: -e["dur"]
    )
    huge = "k" * 10_000_000
    for event in kernels[:8]:
        event["name"] = huge
    data = gzip.compress(json.dumps(trace).encode())
    resp = _post(
        server,
        "bundles",
        {"bundle": ("b.tar.gz", bundle_with("traces/r0.json.gz", data, "kineto"))},
    )
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    assert _analysed(server, run_id)["status"] == "analysed"
    sizes = {}
    for path in (
        f"/api/v1/runs/{run_id}/analysis/result",
        f"/runs/{run_id}.json",
        f"/runs/{run_id}",
    ):
        got = httpx.get(f"{server.url}{path}", timeout=60)
        assert got.status_code == 200
        sizes[path] = len(got.content)
        assert len(got.content) < 2 * MiB, (path, len(got.content))
    report = httpx.get(f"{server.url}/api/v1/runs/{run_id}/analysis/result", timeout=60).text
    assert "[truncated: 10000000 chars]" in report
    record(
        f"a 10 MB kernel name ({len(data) // 1024} KB gzipped upload)",
        "names cut to 4096 characters with a marker holding the full length; pages stay small",
        "report {} KB, JSON twin {} KB, page {} KB".format(*(v // 1024 for v in sizes.values())),
    )


def _closed_within(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``sock`` (recv returns b'' or a 4xx answer)."""
    sock.settimeout(limit)
    started = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open past {limit} s") from None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_slow_headers_are_cut_off(server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()

        # trickle a header byte every 0.3 s: no complete request ever arrives
        def trickle() -> None:
            for _ in range(100):
                time.sleep(0.3)
                try:
                    sock.sendall(b"X")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        _closed_within(sock, TIMEOUT_S + 5)
        took = time.monotonic() - started
    finally:
        sock.close()
    assert took < TIMEOUT_S + 3
    record(
        "slowloris: request headers trickled one byte every 0.3 s",
        f"connection closed after the header timeout ({TIMEOUT_S:.0f} s in the test)",
        f"closed after {took:.1f} s",
    )


def test_stalled_body_is_cut_off(server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(
            b"POST /api/v1/uploads/bundles HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {server.admin_token}\r\n".encode()
            + b"Content-Type: multipart/form-data; boundary=zz\r\nContent-Length: 100000\r\n\r\n"
            + b"--zz\r\n"
        )
        started = time.monotonic()
        _closed_within(sock, TIMEOUT_S + 5)
        took = time.monotonic() - started
    finally:
        sock.close()
    assert took < TIMEOUT_S + 3
    time.sleep(0.5)
    _nothing_left(server)
    record(
        "a request body that stops arriving (Content-Length 100000, 6 bytes sent)",
        f"connection closed after the body timeout ({TIMEOUT_S:.0f} s in the test), no temp file",
        f"closed after {took:.1f} s; tmp/ empty",
    )


def test_oversized_request_head_is_refused(server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        for _ in range(80):  # 80 KiB of headers, over the 64 KiB cap, never completed
            try:
                sock.sendall(b"X-Pad: " + b"a" * 1016 + b"\r\n")
            except OSError:  # the server answered and closed while these were in flight
                break
        sock.settimeout(TIMEOUT_S + 5)
        answer = sock.recv(4096)
        _closed_within(sock, TIMEOUT_S + 5)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
    record(
        "request line + headers over 64 KiB (80 KiB of headers)",
        "400 and the connection closed (the header cap)",
        answer.split(b"\r\n", 1)[0].decode(),
    )


def test_idle_connection_is_cut_off(server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        started = time.monotonic()
        _closed_within(sock, TIMEOUT_S + 5)
        took = time.monotonic() - started
    finally:
        sock.close()
    assert took < TIMEOUT_S + 3
    record(
        "a connection that never sends a byte",
        "closed after the header timeout",
        f"closed after {took:.1f} s",
    )


def test_nothing_was_left_behind(server: Server) -> None:
    _nothing_left(server)
    assert shutil.disk_usage(server.data_dir).free > 0


def test_nan_in_a_manifest_is_never_stored(server: Server) -> None:
    manifest = manifest_for([], extra={"environment": {"gpu_clock": float("nan")}})
    body = json.dumps({"name": "nan-run", "manifest": manifest})  # Python writes NaN
    assert "NaN" in body
    resp = httpx.post(
        f"{server.url}/api/v1/runs",
        content=body,
        headers={**server.headers, "Content-Type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 422, resp.text
    assert "NaN" in resp.json()["error"]
    listed = httpx.get(f"{server.url}/api/v1/runs", params={"name": "nan-run"}, timeout=30)
    assert listed.status_code == 200 and listed.json()["total"] == 0
    record(
        "`NaN` in a run's manifest (POST /runs)",
        "422; nothing stored, every answer strict JSON",
        f"{resp.status_code} '{resp.json()['error']}'",
    )


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of its own: when the expanded trace is accepted, its analysis runs into the
    analysis limits (60 s), and the module's other tests would queue behind it."""
    srv = Server(tmp_path_factory.mktemp("abuse-expanding"), env=ENV).start()
    try:
        yield srv
    finally:
        srv.kill()


def test_expanding_upload_is_bounded_and_does_not_block_a_small_one(own_server: Server) -> None:
    server = own_server
    assert server.proc is not None
    pids = wait_for(
        lambda: (p := validation_pids(server.proc.pid)) and len(p) == 2 and p, 30, "validators"
    )
    big = expanding_bundle(600 << 20, salt="bounded")  # ~20 KB on the wire, 600 MB expanded
    wait_quiet(pids)
    peaks: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:  # peak RSS of every validation process, also of one that is replaced
        while not stop.is_set():
            for pid in validation_pids(server.proc.pid):  # type: ignore[union-attr]
                peak = peak_rss_bytes(pid)
                if peak:
                    peaks[pid] = max(peaks.get(pid, 0), peak)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    answer: dict[str, httpx.Response] = {}
    thread = threading.Thread(
        target=lambda: answer.setdefault(
            "big", _post(server, "bundles", {"bundle": ("big.tar.gz", big)})
        )
    )
    thread.start()
    wait_busy(pids, 60)
    started = time.monotonic()
    small = _post(server, "bundles", {"bundle": ("small.tar.gz", kineto_bundle(salt="small"))})
    small_s = time.monotonic() - started
    thread.join(timeout=300)
    stop.set()
    sampler.join()
    resp = answer["big"]
    assert small.status_code == 201, small.text
    assert small_s < SMALL_UPLOAD_MAX_S
    assert resp.status_code in (201, 413), resp.text
    peak = max(peaks.values())
    assert peak <= VALIDATION_LIMIT, f"validation peak RSS {peak // MiB} MiB"
    _nothing_left(server) if resp.status_code == 413 else None
    record(
        "a 20 KB bundle whose trace expands to 600 MB, with a small upload beside it",
        f"validation stays under its {VALIDATION_LIMIT // MiB} MiB cap (RLIMIT_AS, peak RSS "
        f"measured); the small upload answered within {SMALL_UPLOAD_MAX_S:.0f} s",
        f"big: {resp.status_code} ({resp.json().get('error', 'created')[:70]}); peak RSS "
        f"{peak // MiB} MiB; small upload 201 in {small_s:.1f} s",
    )
