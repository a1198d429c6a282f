"""Builders of real upload artifacts: run bundles from the real test traces, hostile files."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sqlite3
import tarfile
from pathlib import Path
from typing import Any

from testkit import DATA_DIR, REFERENCE_WORKLOAD

from service.core.config import Settings
from service.worker import AnalysisWorker

DATA = DATA_DIR
KINETO_RANK0 = DATA / "synthetic-h200x2" / "kineto_rank0.json.gz"
KINETO_RANK1 = DATA / "synthetic-h200x2" / "kineto_rank1.json.gz"
NSYS_SINGLE = DATA / "synthetic-h200x2" / "nsys_single.sqlite.gz"
NSYS_3ARMS = DATA / "te-2.20.2-h200x2" / "nsys_3arms.sqlite.gz"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_for(
    traces: list[tuple[str, bytes, str, int | None]],
    *,
    name: str = "demo",
    branch: str = "main",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A bundle manifest (format version 1) listing ``traces``."""
    return {
        "schema_version": 1,
        "bundle_version": 1,
        "run": {
            "name": name,
            "branch": branch,
            "commit": "abc123",
            "created_at": "2026-01-01",
            "spec": {"name": name},
            "host": "test",
        },
        "workload": {"implementation": "te", "cp_size": 2, "seqlens": [8192, 4096, 2048, 2048]},
        "traces": [
            {"path": path, "format": fmt, "rank": rank, "sha256": sha256(data)}
            for path, data, fmt, rank in traces
        ],
        **(extra or {}),
    }


def tar_gz(members: list[tuple[str, bytes]], *, links: list[tuple[str, str]] = ()) -> bytes:
    """A ``.tar.gz`` holding exactly ``members`` (plus symlinks), in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def kineto_bundle(*, name: str = "demo", salt: str = "", branch: str = "main") -> bytes:
    """A two-rank Kineto bundle from the real synthetic traces; ``salt`` makes it unique."""
    r0, r1 = KINETO_RANK0.read_bytes(), KINETO_RANK1.read_bytes()
    traces = [("traces/rank0.json.gz", r0, "kineto", 0), ("traces/rank1.json.gz", r1, "kineto", 1)]
    manifest = manifest_for(traces, name=name, branch=branch, extra={"environment": {"salt": salt}})
    members = [("manifest.json", json.dumps(manifest).encode())]
    members += [(path, data) for path, data, _, _ in traces]
    return tar_gz(members)


def bundle_with(trace_name: str, data: bytes, fmt: str, *, rank: int | None = 0) -> bytes:
    """A bundle with one trace whose content the caller chooses (often hostile)."""
    traces = [(trace_name, data, fmt, rank)]
    manifest = manifest_for(traces)
    return tar_gz([("manifest.json", json.dumps(manifest).encode()), (trace_name, data)])


def sqlite_with(tmp: Path, *, trigger: bool = False, view: bool = False) -> bytes:
    """A small nsys-like SQLite file, optionally carrying a trigger or a view."""
    path = tmp / f"hostile-{trigger}-{view}.sqlite"
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, shortName INT)")
    conn.execute("INSERT INTO StringIds VALUES (1, 'k')")
    if trigger:
        conn.execute("CREATE TRIGGER t AFTER INSERT ON StringIds BEGIN DELETE FROM StringIds; END")
    if view:
        conn.execute("CREATE VIEW v AS SELECT * FROM StringIds")
    conn.commit()
    conn.close()
    return path.read_bytes()


_BOMB_BLOCK = 1 << 20


def gzip_repeating(head: bytes, fill: bytes, size: int, tail: bytes = b"") -> bytes:
    """Gzip of ``head``, ``size`` bytes of the byte ``fill``, ``tail``: tiny on the wire, huge when
    expanded. Built as concatenated gzip members, one member of a 1 MiB block repeated (the
    readers' one inflate reads concatenated members as one stream, as gzip does): compressing
    80 MiB at once took 1-6 s per case."""
    block = gzip.compress(fill * _BOMB_BLOCK, compresslevel=9)
    whole, rest = divmod(size, _BOMB_BLOCK)
    return gzip.compress(head) + block * whole + gzip.compress(fill * rest + tail)


def gzip_bomb(size: int) -> bytes:
    """Gzip of a JSON opening plus ``size`` spaces (``gzip_repeating``)."""
    return gzip_repeating(b'{"traceEvents": [', b" ", size)


def tar_gz_bomb(members: list[tuple[str, bytes]], name: str, size: int) -> bytes:
    """A ``.tar.gz`` of ``members`` and then ``name``: ``size`` spaces (the archive's own gzip
    as the bomb, ``gzip_repeating``)."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        for member, data in members:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(name)
        info.size = size
        head = plain.getvalue() + info.tobuf(tar.format, tar.encoding, tar.errors)  # before close
    padding = -size % tarfile.BLOCKSIZE
    return gzip_repeating(head, b" ", size, b"\0" * (padding + 2 * tarfile.BLOCKSIZE))


def auth(token: str) -> dict[str, str]:
    """The Authorization header of a token."""
    return {"Authorization": f"Bearer {token}"}


SPEC_YAML = """\
name: test-job
implementation: bundled
ranks: 2
seqlens: [256, 128]
heads: 2
head_dim: 16
"""


KINETO_3ARMS = [DATA / "te-2.20.2-h200x2" / f"kineto_3arms_rank{r}.json.gz" for r in (0, 1)]
CU = [0, 8192, 12288, 14336, 16384]
ARMS = {
    "auto_clone": {
        "cu_seqlens": CU,
        "cu_seqlens_padded": CU,
        "padded_is_same_object": False,
        "pad_between_seqs": None,
    },
    "explicit_false": {
        "cu_seqlens": CU,
        "cu_seqlens_padded": CU,
        "padded_is_same_object": False,
        "pad_between_seqs": False,
    },
    "auto_same": {
        "cu_seqlens": CU,
        "cu_seqlens_padded": CU,
        "padded_is_same_object": True,
        "pad_between_seqs": None,
    },
}


def te_3arms_bundle(
    *, name: str = "te-3arms", branch: str = "main", iteration_ms: list[float] | None = None
) -> bytes:
    """The reference workload's real Kineto traces (TE 2.20.2, 2x H200), three arms.

    The traces carry no timed iterations; ``iteration_ms`` (test values, not measurements) gives
    every arm and rank those samples, for tests that need a run-level median.
    """
    data = [p.read_bytes() for p in KINETO_3ARMS]
    traces = [(f"traces/rank{r}.json.gz", d, "kineto", r) for r, d in enumerate(data)]
    manifest = manifest_for(traces, name=name, branch=branch)
    manifest["workload"] = dict(REFERENCE_WORKLOAD)
    manifest["variants"] = [
        {"name": arm, "window": f"arm:{arm}", "facts": facts} for arm, facts in ARMS.items()
    ]
    if iteration_ms is not None:
        for variant in manifest["variants"]:
            variant["iteration_ms"] = {rank: iteration_ms for rank in (0, 1)}
    members = [("manifest.json", json.dumps(manifest).encode())]
    return tar_gz(members + [(p, d) for p, d, _, _ in traces])


def drain_worker(settings: Settings, **options: Any) -> None:
    """Let one analysis worker (``options``: its keyword arguments) take every queued run,
    then close it."""
    worker = AnalysisWorker(settings, **options)
    try:
        while worker.run_once():
            pass
    finally:
        worker.close()
