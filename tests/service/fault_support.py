"""Helpers of the fault and abuse tests: child processes of a server, peak RSS, blob orphans,
and the log that ``scripts/fault_table.py`` turns into the table in docs/service.md."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from pathlib import Path

import httpx

FAULT_LOG_ENV = "CPTRACE_FAULT_LOG"


def record(attack: str, expected: str, observed: str) -> None:
    """Append one row of the fault-and-abuse table (when ``CPTRACE_FAULT_LOG`` names a file)."""
    target = os.environ.get(FAULT_LOG_ENV)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"attack": attack, "expected": expected, "observed": observed}) + "\n")


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    """Live (not zombie) direct children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is not None and st[0] == pid and st[1] != "Z":
            found.append(int(entry.name))
    return found


def worker_pid(server_pid: int) -> int | None:
    for pid in children(server_pid):
        if ".worker" in cmdline(pid):  # service.worker, or cptrace.worker as served
            return pid
    return None


def validation_pids(server_pid: int) -> list[int]:
    return [p for p in children(server_pid) if "spawn_main" in cmdline(p)]


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM (peak resident set) of a live process."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment mentions ``text`` (a data dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[1] == "Z":
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            env = ""
        if text in cmdline(pid) or text in env:
            found.append(pid)
    return found


def orphan_blobs(data_dir: Path) -> list[str]:
    """Blob files on disk that no ``blobs`` row refers to."""
    conn = sqlite3.connect(data_dir / "cptrace.db")
    try:
        known = {r[0] for r in conn.execute("SELECT sha256 FROM blobs")}
    finally:
        conn.close()
    root = data_dir / "blobs"
    on_disk = {p.parent.name + p.name for p in root.glob("??/*")} if root.is_dir() else set()
    return sorted(on_disk - known)


def health(url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    resp = httpx.get(f"{url}/api/v1/health", timeout=10)
    return resp.status_code, resp.json()


def watch_health(url: str, predicate, timeout: float, interval: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll /health until ``predicate(status, body)``; returns (status, body, seconds)."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < timeout:
        try:
            last = health(url)
        except httpx.HTTPError:
            time.sleep(interval)
            continue
        if predicate(*last):
            return (*last, time.monotonic() - start)
        time.sleep(interval)
    raise AssertionError(f"/health never matched within {timeout}s; last: {last}")


def expanding_kineto_gz(expanded_bytes: int) -> bytes:
    """A gzipped Kineto JSON of about ``expanded_bytes`` that compresses ~1000x: small on the
    wire, huge in memory when parsed whole."""
    import zlib

    event = (
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, '
        b'"ts": 1000, "dur": 5, "args": {}},'
    )
    chunk = event * (1 << 14)
    comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [comp.compress(b'{"schemaVersion": 1, "traceEvents": [')]
    written = 0
    while written < expanded_bytes:
        parts.append(comp.compress(chunk))
        written += len(chunk)
    parts.append(comp.compress(event[:-1] + b"]}"))
    parts.append(comp.flush())
    return b"".join(parts)


def expanding_bundle(expanded_bytes: int, *, salt: str = "") -> bytes:
    """A run bundle whose one trace is ``expanding_kineto_gz(expanded_bytes)``."""
    from service_factories import manifest_for, tar_gz

    data = expanding_kineto_gz(expanded_bytes)
    traces = [("traces/rank0.json.gz", data, "kineto", 0)]
    manifest = manifest_for(traces, extra={"environment": {"salt": salt}})
    return tar_gz([("manifest.json", json.dumps(manifest).encode()), traces[0][:2]])


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def wait_busy(pids: list[int], timeout: float, ticks: int = 5) -> int:
    """The first of ``pids`` to use ``ticks`` more CPU ticks than now (it took the work)."""
    base = {p: cpu_ticks(p) for p in pids}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in pids:
            if cpu_ticks(p) - base[p] >= ticks:
                return p
        time.sleep(0.01)
    raise AssertionError(f"none of {pids} started working within {timeout}s")


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child not yet reaped by init)."""
    st = _stat(pid)
    return st is not None and st[1] != "Z"


class _Repeat:
    """A read-only file of ``size`` bytes: a JSON opening, one event repeated, the closing."""

    EVENT = (
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, '
        b'"ts": 1000, "dur": 5, "args": {}},'
    )

    def __init__(self, size: int) -> None:
        head, tail = b'{"schemaVersion": 1, "traceEvents": [', self.EVENT[:-1] + b"]}"
        body = (size - len(head) - len(tail)) // len(self.EVENT)
        self.parts = [
            (head, 1),
            (self.EVENT * 4096, body // 4096),
            (self.EVENT, body % 4096),
            (tail, 1),
        ]
        self.size = sum(len(p) * n for p, n in self.parts)

    def chunks(self):  # type: ignore[no-untyped-def]
        for part, count in self.parts:
            for _ in range(count):
                yield part


@functools.lru_cache(maxsize=2)
def slow_bundle(size: int, *, salt: str = "") -> bytes:
    """A ~size/1000 byte bundle whose trace member is ``size`` bytes of plain JSON: the reader
    inflates, hashes and stores all of it, so validation takes seconds (not a memory attack)."""
    import hashlib
    import io
    import tarfile
    import zlib

    trace = _Repeat(size)
    digest = hashlib.sha256()
    for chunk in trace.chunks():
        digest.update(chunk)
    manifest = {
        "schema_version": 1,
        "bundle_version": 1,
        "run": {"name": "slow", "branch": "main", "commit": "abc", "host": "test"},
        "environment": {"salt": salt},
        "traces": [
            {
                "path": "traces/rank0.json",
                "format": "kineto",
                "rank": 0,
                "sha256": digest.hexdigest(),
            }
        ],
    }
    raw = json.dumps(manifest).encode()

    class Reader(io.RawIOBase):
        def __init__(self) -> None:
            self.it = trace.chunks()
            self.buf = b""

        def readable(self) -> bool:
            return True

        def read(self, n: int = -1) -> bytes:
            while len(self.buf) < n:
                try:
                    self.buf += next(self.it)
                except StopIteration:
                    break
            out, self.buf = self.buf[:n], self.buf[n:]
            return out

    tar_buf = io.BytesIO()
    comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    class Sink(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b) -> int:  # type: ignore[no-untyped-def]
            tar_buf.write(comp.compress(bytes(b)))
            return len(b)

    with tarfile.open(fileobj=Sink(), mode="w|") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        info = tarfile.TarInfo("traces/rank0.json")
        info.size = trace.size
        tar.addfile(info, Reader())
    tar_buf.write(comp.flush())
    return tar_buf.getvalue()


def wait_quiet(pids: list[int], timeout: float = 60, quiet_s: float = 0.5) -> None:
    """Until none of ``pids`` uses CPU for ``quiet_s`` (freshly spawned ones import for a while)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = [cpu_ticks(p) for p in pids]
        time.sleep(quiet_s)
        if [cpu_ticks(p) for p in pids] == before:
            return
    raise AssertionError(f"{pids} never went quiet within {timeout}s")
