"""Start-up chores of ``cptrace serve``: sweep what a killed predecessor left, an admin token,
and the demo runs.

Both are idempotent: the admin token is created only when no admin token exists (its secret is
printed once by the caller and stored hashed), and a demo bundle is keyed by its sha256 like
any upload, so starting the server twice ingests nothing twice.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from service.auth import Role, count_tokens, create_token
from service.core.config import Settings
from service.ingest import Limits, StagedRun, record_run, stage_bundle
from service.storage import runs
from service.storage.blob_rows import recorded_digests
from service.storage.blobs import open_blobs
from service.storage.database import Database, immediate


@dataclass(frozen=True, slots=True)
class Swept:
    """What the start-up sweep removed."""

    temp_files: int
    orphan_blobs: int
    scratch_folders: int

    @property
    def total(self) -> int:
        return self.temp_files + self.orphan_blobs + self.scratch_folders

    def describe(self) -> str:
        return (
            f"{self.temp_files} temp file(s), {self.orphan_blobs} blob(s) without a row, "
            f"{self.scratch_folders} analysis scratch folder(s)"
        )


def sweep_at_startup(db: Database, settings: Settings) -> Swept:
    """Nothing half-written survives a restart: partial uploads and validation copies in
    ``tmp/``, blob files whose run was never recorded (killed between validation and the
    insert), and scratch folders of killed analyses. Call before serving (no upload in flight).
    """
    from service.worker import sweep_scratch

    blobs = open_blobs(settings.blob_location, settings.tmp_dir)
    blobs.check()  # an unreachable or missing S3 bucket stops the start, with its reason
    temp = blobs.clean_tmp()
    scratch = db.read(lambda c: sweep_scratch(settings.tmp_dir, c))
    known = db.read(recorded_digests)
    orphans = blobs.sweep_orphans(known.__contains__)
    return Swept(temp, orphans, scratch)


def ensure_admin_token(db: Database) -> str | None:
    """Create an admin token if there is none; returns its secret, or None if one existed."""

    def create(conn: sqlite3.Connection) -> str | None:
        with immediate(conn):
            if count_tokens(conn, Role.ADMIN) > 0:
                return None
            return create_token(conn, role=Role.ADMIN, name="first-start admin")

    return db.write(create)


@dataclass(frozen=True, slots=True)
class SeedResult:
    """What happened to one demo bundle."""

    path: Path
    run_id: int | None
    created: bool
    error: str | None = None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _known_run(conn: sqlite3.Connection, key: str) -> int | None:
    return runs.find_upload(conn, key=key)


def seed_demo(db: Database, settings: Settings, bundle_dir: Path) -> list[SeedResult]:
    """Ingest every ``*.tar.gz`` bundle in ``bundle_dir`` once (queued for analysis)."""
    results = []
    limits = Limits(settings.max_decompressed_bytes, settings.max_bundle_members)
    for path in sorted(bundle_dir.glob("*.tar.gz")):
        key = f"bundle:{_sha256(path)}"
        known = db.read(partial(_known_run, key=key))
        if known is not None:
            results.append(SeedResult(path, known, False))
            continue
        try:
            staged = stage_bundle(path, settings.blob_location, settings.tmp_dir, limits)
        except Exception as exc:  # one bad demo bundle must not stop the server
            results.append(SeedResult(path, None, False, str(exc)))
            continue

        def record(
            conn: sqlite3.Connection, staged: StagedRun = staged, key: str = key
        ) -> tuple[int, bool]:
            with immediate(conn):
                return record_run(conn, staged, key=key, source="demo")

        run_id, created = db.write(record)
        results.append(SeedResult(path, run_id, created))
    return results


def default_demo_dir() -> Path:
    """``demo/bundles`` of the source checkout, else of the current directory."""
    here = Path(__file__).resolve().parent.parent / "demo" / "bundles"
    return here if here.is_dir() else Path("demo") / "bundles"
