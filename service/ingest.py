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
import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzers.bundle import BundleFile, BundleTrace, OversizedBundleError, read_bundle_stream
from analyzers.errors import TraceTooLargeError
from analyzers.readers import Kind, check_trace, inflated, is_gzip, sniff
from service.core.errors import PayloadTooLarge
from service.phase_timer import PhaseTimer
from service.storage import runs
from service.storage.blobs import BlobLocation, Blobs, PendingBlob, open_blobs
from service.storage.engine import Conn, lock_name


@dataclass(frozen=True, slots=True)
class Limits:
    """What an upload may expand to."""

    max_decompressed_bytes: int
    max_members: int
    max_stored_bytes: int | None = None
    """What the bundle's members may store together (None: ``max_decompressed_bytes``)."""


@dataclass(slots=True)
class StagedFile:
    """A validated file already in the blob store."""

    role: str  # "trace" | "log" | "manifest"
    name: str  # label for people; never a path
    sha256: str
    size: int
    format: str | None = None  # "nsys" | "kineto" | "report" for traces
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
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per staging phase (wall; ``cpu`` = the staging process's CPU), for the
    upload's ``Server-Timing`` header and the benchmark."""


def config_key(manifest: dict[str, Any] | None) -> str | None:
    """A stable key for "the same workload": hash of the manifest's workload block."""
    workload = (manifest or {}).get("workload")
    if not isinstance(workload, dict) or not workload:
        return None
    canonical = json.dumps({k: v for k, v in workload.items() if v is not None}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


MAX_PENDING_SYNCS = 32
"""Member files a bundle may have written but not yet flushed to disk (each holds an open file)."""


class BlobSink:
    """The bundle reader's ``MemberSink`` over the blob store: each member goes to a temp file
    in ``tmp/``; ``commit`` stores it under the sha256 the reader computed, once the whole
    bundle passed; ``discard`` removes whatever was not committed.

    Each temp file is spooled (``Blobs.spool``: flushed to disk with ``fsync`` for the local
    folder, uploaded in parts to a staging key for S3) in a background thread started as soon
    as the member is written: the disk or the network works while the reader inflates the next
    member and the traces are checked, instead of the upload waiting for each file in turn.
    ``commit`` waits for them all.
    """

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs
        self._temps: list[Path] = []
        self._syncs: list[Future[None]] = []
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cptrace-fsync")
        self.sync_wait_s = 0.0
        """Seconds ``commit`` waited for the disk (for the upload's timings)."""

    def put(self, member: str, chunks: Iterable[bytes]) -> Path:
        fh, temp = self.blobs.open_temp()
        self._temps.append(temp)
        with fh:
            for chunk in chunks:
                fh.write(chunk)
        if len(self._syncs) >= MAX_PENDING_SYNCS:  # bound the spools in flight of a big bundle
            self._syncs.pop(0).result()
        self._syncs.append(self._pool.submit(self.blobs.spool, temp))
        return temp

    def put_inflated(self, trace: BundleTrace, *, cap: int, room: int) -> BundleTrace:
        """``trace`` (a gzipped SQLite export) as the plain file the store keeps
        (``inflate_export``), spooled like every member; the gzipped member is discarded."""
        pending = inflate_export(self.blobs, trace.path, label=trace.member, cap=cap, room=room)
        self._temps.append(pending.path)
        self._syncs.append(self._pool.submit(self.blobs.spool, pending.path))
        return dataclasses.replace(
            trace, path=pending.path, sha256=pending.sha256, size=pending.size, gzipped=False
        )

    def commit(self, files: Iterable[BundleFile]) -> None:
        started = time.perf_counter()
        self._wait_for_disk()
        self.sync_wait_s = time.perf_counter() - started
        for f in files:
            self.blobs.commit(f.path, f.sha256, f.size)

    def discard(self) -> None:
        with contextlib.suppress(Exception):  # a failed spool already failed the upload
            self._wait_for_disk()
        self._pool.shutdown(wait=True)
        for temp in self._temps:
            # committed ones are gone from tmp/ already; a staging object S3 would not delete
            # now is swept at a later start
            with contextlib.suppress(Exception):
                self.blobs.discard_temp(temp)

    def _wait_for_disk(self) -> None:
        syncs, self._syncs = self._syncs, []
        for sync in syncs:
            sync.result()  # an OSError (disk full, I/O error, S3 refused) fails the upload


def stored_plain(kind: Kind | None, gzipped: bool) -> bool:
    """Whether a trace is stored inflated: a gzipped SQLite export is.

    SQLite opens only a plain file, so a stored ``.sqlite.gz`` would be inflated in full by
    the upload check and again by every analysis. Its one inflate happens at upload instead,
    into the blob store's ``tmp/``: the check reads that copy, and that copy is the blob the
    analysis opens as it is. Kineto JSON streams, so it is stored as uploaded.
    """
    return kind == "sqlite" and gzipped


def inflate_export(blobs: Blobs, source: Path, *, label: str, cap: int, room: int) -> PendingBlob:
    """The gzipped file ``source`` inflated (the one capped inflate, ``cap``) into a hashed
    temp file of ``blobs``, which the store keeps in its place: what it expands to is what
    the upload stores, so it must also fit in ``room`` (the bytes this upload may store).

    :raises TraceTooLargeError: the data expands past ``cap`` or ``room``.
    :raises CorruptTraceError: damaged or truncated gzip data.
    """
    with source.open("rb") as raw:
        try:
            return blobs.stage_chunks(inflated(raw, cap, label=label), limit=room)
        except PayloadTooLarge:
            raise TraceTooLargeError(
                f"{label}: decompresses to more than the {room} bytes this upload may store "
                "(an nsys SQLite export is stored decompressed)"
            ) from None


def stage_bundle(bundle: Path, blobs_at: BlobLocation, tmp_dir: Path, limits: Limits) -> StagedRun:
    """Read a ``.tar.gz`` (or ``.tar``) run bundle once, check it, store its files as blobs.

    The archive streams through ``analyzers.bundle.read_bundle_stream`` (member checks,
    hashing, the manifest parsed once) into temp files; each trace then gets the readers'
    upload check (``check_trace``: structural, streaming); a gzipped SQLite export is
    inflated once first and stored so (``stored_plain``), within what the bundle may store.
    Only a bundle that passes every check moves its files into the blob store, so a refused
    upload leaves nothing behind.

    :raises TraceError: (mapped to 4xx by the app) naming the member and field at fault.
    """
    phases = PhaseTimer(cpu=True)
    sink = BlobSink(open_blobs(blobs_at, tmp_dir))
    try:
        with bundle.open("rb") as fh:
            opened = read_bundle_stream(
                fh,
                sink=sink,
                source="bundle",
                max_member_bytes=limits.max_stored_bytes or limits.max_decompressed_bytes,
                max_total_bytes=limits.max_stored_bytes or limits.max_decompressed_bytes,
                max_members=limits.max_members,
            )
        phases.lap("read")
        manifest = opened.manifest_file
        assert manifest is not None  # a tar's manifest is a member
        budget = limits.max_stored_bytes or limits.max_decompressed_bytes
        stored = sum(f.size for f in [manifest, *opened.traces, *opened.logs])
        traces: list[BundleTrace] = []
        for trace in opened.traces:
            if stored_plain(trace.kind, trace.gzipped):
                room = budget - (stored - trace.size)
                try:
                    plain = sink.put_inflated(trace, cap=limits.max_decompressed_bytes, room=room)
                except TraceTooLargeError as exc:  # the bundle's limit (and quota message)
                    raise OversizedBundleError(str(exc)) from None
                stored += plain.size - trace.size
                trace = plain
            check_trace(
                trace.path,
                label=trace.member,
                max_bytes=limits.max_decompressed_bytes,
                kind=trace.kind,  # the bundle reader sniffed it to check the manifest's format
                gzipped=trace.gzipped,
            )
            traces.append(trace)
        phases.lap("check")
        kept: list[BundleFile] = [manifest, *traces, *opened.logs]
        sink.commit(kept)
        phases.lap("commit")
        phases.record("sync-wait", sink.sync_wait_s)
    finally:
        sink.discard()
    files = [StagedFile("manifest", manifest.member, manifest.sha256, manifest.size)]
    files += [
        StagedFile("trace", t.member, t.sha256, t.size, t.format, t.gzipped, t.rank) for t in traces
    ]
    files += [StagedFile("log", f.member, f.sha256, f.size) for f in opened.logs]
    run = opened.run
    return StagedRun(
        name=run.name or "bundle",
        files=files,
        manifest=opened.manifest_json,
        spec=run.spec,
        branch=run.branch,
        commit=run.commit,
        host=run.host,
        config_key=config_key(opened.manifest_json),
        timings=phases.done(),
    )


def stage_trace(
    upload: Path,
    sha256: str,
    name: str,
    blobs_at: BlobLocation,
    tmp_dir: Path,
    limits: Limits,
    rank: int | None = None,
) -> StagedRun:
    """Check one uploaded trace file (or saved report) with ``check_trace``, then store it.

    ``upload`` is the received temp file (in ``tmp/``) and ``sha256`` its digest, computed
    while it arrived: the file itself is stored, not copied and hashed a second time. It is
    spooled (flushed to disk, or uploaded in parts to S3) while the check runs. A gzipped
    SQLite export is stored inflated instead (``stored_plain``).
    """
    phases = PhaseTimer(cpu=True)
    blobs = open_blobs(blobs_at, tmp_dir)
    kind, gzipped = sniff(upload, label=name), is_gzip(upload)
    if stored_plain(kind, gzipped):
        return _stage_plain_export(upload, name, blobs, limits, rank, phases)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cptrace-spool") as pool:
        spooled = pool.submit(blobs.spool, upload)
        try:
            checked = check_trace(
                upload,
                label=name,
                max_bytes=limits.max_decompressed_bytes,
                kind=kind,
                gzipped=gzipped,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                spooled.result()
            blobs.discard_temp(upload)
            raise
        phases.lap("check")
        spooled.result()
    size = upload.stat().st_size
    blobs.commit(upload, sha256, size)
    phases.lap("commit")
    staged = StagedFile(
        "trace", name, sha256, size, checked.format or checked.kind, checked.gzipped, rank
    )
    return StagedRun(name=name, files=[staged], timings=phases.done())


def _stage_plain_export(
    upload: Path, name: str, blobs: Blobs, limits: Limits, rank: int | None, phases: PhaseTimer
) -> StagedRun:
    """``stage_trace`` of a gzipped SQLite export: inflated once, checked, stored plain (the
    received upload is left to its caller, which removes it)."""
    room = limits.max_stored_bytes or limits.max_decompressed_bytes
    pending = inflate_export(
        blobs, upload, label=name, cap=limits.max_decompressed_bytes, room=room
    )
    try:
        phases.lap("inflate")
        checked = check_trace(pending.path, label=name, kind="sqlite", gzipped=False)
        phases.lap("check")
        blobs.commit_pending(pending)
    except BaseException:
        blobs.discard_temp(pending.path)
        raise
    phases.lap("commit")
    staged = StagedFile("trace", name, pending.sha256, pending.size, checked.format, False, rank)
    return StagedRun(name=name, files=[staged], timings=phases.done())


def record_run(
    conn: Conn,
    staged: StagedRun,
    *,
    key: str,
    source: str,
    run_id: int | None = None,
    token_id: int | None = None,
    quota: int | None = None,
) -> tuple[int, bool]:
    """Insert the run (or add files to ``run_id``) plus an analysis task; one transaction.
    ``token_id``: the uploading token (whose runner may then complete a job with this run);
    ``quota``: the most bytes that token's runs may store (:raises PayloadTooLarge: past it).

    Returns ``(run_id, created)``; ``created`` is False when ``key`` was seen before.
    :raises NotFound: ``run_id`` is given and does not exist.
    """
    from service.analysis import enqueue_analysis

    lock_name(conn, f"upload:{key}")  # two API processes recording one upload: one at a time
    existing = runs.find_upload(conn, key=key)
    if existing is not None:
        return existing, False
    if run_id is None:
        run_id = runs.create_run(
            conn,
            name=staged.name,
            source=source,
            status="queued",
            branch=staged.branch,
            commit=staged.commit,
            host=staged.host,
            config_key=staged.config_key,
            manifest=staged.manifest,
            spec=staged.spec,
        )
    else:
        runs.require_run(conn, run_id=run_id)
    for f in staged.files:
        runs.add_run_file(
            conn,
            run_id=run_id,
            role=f.role,
            name=f.name,
            sha256=f.sha256,
            size=f.size,
            format=_file_format(f),
            rank=f.rank,
        )
    runs.record_upload(conn, key=key, run_id=run_id, token_id=token_id, quota=quota)
    enqueue_analysis(conn, run_id)
    return run_id, True


def _file_format(f: StagedFile) -> str | None:
    if f.format is None:
        return None
    return f.format + ("+gzip" if f.gzipped else "")
