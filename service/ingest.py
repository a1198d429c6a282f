"""Turn an uploaded bundle or trace into blobs plus one run, all or nothing.

Two phases, so a killed server never leaves a partial run:

1. ``stage_bundle`` / ``stage_trace`` (CPU-heavy, runs in a separate process so the API stays
   responsive): validate the upload and write every file into the content-addressed blob store.
   Blobs without a run are harmless; they are just unreferenced content.
2. ``record_run`` (on the writer, inside ``BEGIN IMMEDIATE``): insert the run, its files, the
   idempotency key and the analysis task in one transaction. The key check happens inside that
   transaction, so concurrent identical uploads create one run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.auth import now_iso
from service.core.config import MAX_RANK
from service.core.errors import BadRequest, UnprocessableEntity
from service.safety import CappedGzipReader, iter_tar_members, sniff_trace, validate_trace
from service.storage.blobs import BlobStore, PendingBlob
from service.strict_json import strict_dumps

MAX_MANIFEST_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What an upload may expand to."""

    max_decompressed_bytes: int
    max_members: int


@dataclass(slots=True)
class StagedFile:
    """A validated file already in the blob store."""

    role: str  # "trace" | "log" | "manifest"
    name: str  # label for people; never a path
    sha256: str
    size: int
    format: str | None = None  # "nsys" | "kineto" for traces
    gzipped: bool = False
    rank: int | None = None


@dataclass(slots=True)
class StagedRun:
    """Everything ``record_run`` needs, as plain data (it crosses a process boundary)."""

    name: str
    files: list[StagedFile]
    manifest: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    branch: str | None = None
    commit: str | None = None
    host: str | None = None
    config_key: str | None = None
    notes: list[str] = field(default_factory=list)


def config_key(manifest: dict[str, Any] | None) -> str | None:
    """A stable key for "the same workload": hash of the manifest's workload block."""
    workload = (manifest or {}).get("workload")
    if not isinstance(workload, dict) or not workload:
        return None
    canonical = json.dumps({k: v for k, v in workload.items() if v is not None}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _parse_manifest(blob: Path) -> dict[str, Any]:
    from analyzers.manifest import ManifestError, parse_manifest

    if blob.stat().st_size > MAX_MANIFEST_BYTES:
        raise BadRequest(f"manifest.json is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        raw = json.loads(blob.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"manifest.json: invalid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise BadRequest("manifest.json: expected a JSON object at the top level")
    try:
        parse_manifest(raw, source="manifest.json")
    except ManifestError as exc:
        raise UnprocessableEntity(str(exc)) from exc
    return raw


def _check_trace(
    path: Path,
    sha: str,
    size: int,
    name: str,
    limits: Limits,
    tmp_dir: Path,
    rank: int | None,
    expected_format: str | None,
) -> StagedFile:
    kind = sniff_trace(path, cap=limits.max_decompressed_bytes, label=name)
    if expected_format and expected_format != kind.format:
        raise UnprocessableEntity(
            f"{name}: manifest says format {expected_format!r} but the content is {kind.format!r}"
        )
    validate_trace(path, kind, cap=limits.max_decompressed_bytes, label=name, tmp_dir=tmp_dir)
    return StagedFile("trace", name, sha, size, kind.format, kind.gzipped, rank)


def _trace_entries(
    manifest: dict[str, Any], members: dict[str, tuple[str, int]]
) -> list[dict[str, Any]]:
    entries = manifest.get("traces")
    if entries is None:  # no list: every file under traces/ is a trace of unknown rank
        return [{"path": n} for n in sorted(members) if n.startswith("traces/")]
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and "path" in e for e in entries
    ):
        raise UnprocessableEntity(
            "manifest.json: field traces: expected a list of {path, ...} objects"
        )
    listed = {str(e["path"]) for e in entries}
    for name in members:
        if name.startswith("traces/") and name not in listed:
            raise UnprocessableEntity(
                f"manifest.json: {name} is in the bundle but not listed in traces"
            )
    return entries


def _check_entry(
    entry: dict[str, Any], members: dict[str, tuple[str, int]]
) -> tuple[str, int, int | None]:
    path = str(entry["path"])
    if path not in members:
        raise UnprocessableEntity(f"manifest.json: trace {path!r} is not in the bundle")
    sha, size = members[path]
    if entry.get("sha256") and entry["sha256"] != sha:
        raise UnprocessableEntity(
            f"manifest.json: trace {path!r}: sha256 {entry['sha256']} does not match the "
            f"content ({sha})"
        )
    rank = entry.get("rank")
    if rank is not None and (
        not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= MAX_RANK
    ):
        raise UnprocessableEntity(
            f"manifest.json: trace {path!r}: rank must be an integer from 0 to {MAX_RANK}"
        )
    return sha, size, rank


def stage_bundle(bundle: Path, blob_root: Path, tmp_dir: Path, limits: Limits) -> StagedRun:
    """Validate a ``.tar.gz`` (or ``.tar``) run bundle and store its files as blobs.

    Members are staged in temp files and validated there; only a bundle that passes every check
    moves its files into the blob store, so a refused upload leaves nothing behind.

    :raises ApiError: 400/413/422 with the member and field at fault.
    """
    blobs = BlobStore(blob_root, tmp_dir)
    pending: dict[str, PendingBlob] = {}
    try:
        staged = _stage_members(bundle, blobs, limits, pending)
        for blob in pending.values():
            blobs.commit_pending(blob)
        return staged
    finally:
        for blob in pending.values():
            blob.discard()  # no-op for committed blobs (their temp file was renamed)


def _read_members(
    bundle: Path, blobs: BlobStore, limits: Limits, pending: dict[str, PendingBlob]
) -> None:
    with bundle.open("rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = CappedGzipReader(raw, limits.max_decompressed_bytes, label="bundle") if gz else raw
        for name, _info, reader in iter_tar_members(stream, max_members=limits.max_members):  # type: ignore[arg-type]
            if name in pending:
                raise BadRequest(f"bundle member {name!r} appears twice")
            pending[name] = blobs.stage_file(reader, limit=limits.max_decompressed_bytes)


def _stage_members(
    bundle: Path, blobs: BlobStore, limits: Limits, pending: dict[str, PendingBlob]
) -> StagedRun:
    _read_members(bundle, blobs, limits, pending)
    members = {name: (p.sha256, p.size) for name, p in pending.items()}
    if "manifest.json" not in pending:
        raise BadRequest("bundle has no manifest.json at its top level")
    manifest = _parse_manifest(pending["manifest.json"].path)
    files = [StagedFile("manifest", "manifest.json", *members["manifest.json"])]
    entries = _trace_entries(manifest, members)
    if not entries:
        raise UnprocessableEntity("bundle holds no traces (expected files under traces/)")
    for entry in entries:
        sha, size, rank = _check_entry(entry, members)
        path = str(entry["path"])
        files.append(
            _check_trace(
                pending[path].path, sha, size, path, limits, blobs.tmp, rank, entry.get("format")
            )
        )
    files += [
        StagedFile("log", n, s, z) for n, (s, z) in sorted(members.items()) if n.startswith("logs/")
    ]
    _reader_check(bundle, blobs.tmp, limits)
    run = manifest.get("run") if isinstance(manifest.get("run"), dict) else {}
    assert isinstance(run, dict)
    return StagedRun(
        name=str(run.get("name") or "bundle"),
        files=files,
        manifest=manifest,
        spec=run.get("spec") if isinstance(run.get("spec"), dict) else None,
        branch=_str(run.get("branch")),
        commit=_str(run.get("commit")),
        host=_str(run.get("host")),
        config_key=config_key(manifest),
    )


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _reader_check(bundle: Path, tmp_dir: Path, limits: Limits) -> None:
    """Let the analyzers' bundle reader (the runners' contract) validate the bundle too."""
    try:
        from analyzers.bundle import read_bundle
    except ImportError:
        return
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError

    try:
        result = read_bundle(
            bundle, extract_to=tmp_dir, max_total_bytes=limits.max_decompressed_bytes
        )
    except (TraceError, ManifestError) as exc:
        raise UnprocessableEntity(f"bundle: {str(exc).replace(str(bundle), 'bundle')}") from exc
    with contextlib.suppress(Exception):
        result.close()


def stage_trace(
    upload: Path, name: str, blob_root: Path, tmp_dir: Path, limits: Limits, rank: int | None = None
) -> StagedRun:
    """Validate one uploaded trace file, then store it as a blob."""
    blobs = BlobStore(blob_root, tmp_dir)
    with upload.open("rb") as fh:
        pending = blobs.stage_file(fh)
    try:
        staged = _check_trace(
            pending.path, pending.sha256, pending.size, name, limits, tmp_dir, rank, None
        )
        blobs.commit_pending(pending)
    finally:
        pending.discard()
    return StagedRun(name=name, files=[staged])


def record_run(
    conn: sqlite3.Connection, staged: StagedRun, *, key: str, source: str, run_id: int | None = None
) -> tuple[int, bool]:
    """Insert the run (or add files to ``run_id``) plus an analysis task; one transaction.

    Returns ``(run_id, created)``; ``created`` is False when ``key`` was seen before.
    """
    from service.analysis import enqueue_analysis

    existing = conn.execute("SELECT run_id FROM uploads WHERE key = ?", (key,)).fetchone()
    if existing is not None:
        return int(existing[0]), False
    now = now_iso()
    if run_id is None:
        cur = conn.execute(
            "INSERT INTO runs (name, branch, commit_sha, host, source, status, config_key, "
            "manifest_json, spec_json, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                staged.name,
                staged.branch,
                staged.commit,
                staged.host,
                source,
                "queued",
                staged.config_key,
                _dump(staged.manifest),
                _dump(staged.spec),
                now,
                now,
            ),
        )
        run_id = int(cur.lastrowid or 0)
    for f in staged.files:
        conn.execute(
            "INSERT OR IGNORE INTO blobs (sha256, size, created_at) VALUES (?, ?, ?)",
            (f.sha256, f.size, now),
        )
        conn.execute(
            "INSERT INTO run_files (run_id, role, name, format, rank, sha256, size) "
            "VALUES (?,?,?,?,?,?,?)",
            (run_id, f.role, f.name, _file_format(f), f.rank, f.sha256, f.size),
        )
    conn.execute(
        "INSERT INTO uploads (key, run_id, created_at) VALUES (?, ?, ?)", (key, run_id, now)
    )
    enqueue_analysis(conn, run_id)
    return run_id, True


def _file_format(f: StagedFile) -> str | None:
    if f.format is None:
        return None
    return f.format + ("+gzip" if f.gzipped else "")


def _dump(value: Any) -> str | None:
    return None if value is None else strict_dumps(value, what="manifest.json")
