"""Write run bundles (format in ``docs/bundle.md``; reading is ``analyzers.bundle``).

A bundle directory is assembled in place (traces copied or written under ``traces/``), then
``finalize_bundle`` hashes every trace and writes ``manifest.json`` last, atomically: a bundle
without a manifest is visibly unfinished. ``pack_bundle`` makes a byte-reproducible
``.tar.gz`` (sorted members, zeroed owners and times), so the same run content always has the same
sha256 and a retried upload is recognized as the same upload.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzers.bundle import BUNDLE_VERSION, MANIFEST_NAME, file_sha256, read_bundle
from analyzers.manifest import MANIFEST_SCHEMA_VERSION


def trace_entry(member: str, *, fmt: str, rank: int | None) -> dict[str, Any]:
    """A ``traces`` entry before hashing (``finalize_bundle`` adds sha256 and size)."""
    return {"path": member, "format": fmt, "rank": rank}


def add_trace(bundle_dir: Path, source: Path, *, name: str | None = None) -> str:
    """Copy a trace file into ``bundle_dir/traces/``; return its member path."""
    traces = bundle_dir / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    target = traces / (name or source.name)
    shutil.copyfile(source, target)
    return f"traces/{target.name}"


def gzip_file(path: Path) -> Path:
    """Gzip ``path`` next to itself (mtime 0, reproducible) and remove the original."""
    target = path.with_name(path.name + ".gz")
    with (
        path.open("rb") as src,
        target.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
    ):
        shutil.copyfileobj(src, gz, 1024 * 1024)
    path.unlink()
    return target


def run_info(
    *, name: str, spec: dict[str, Any], host: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The manifest's ``run`` object: who ran what, when. ``extra``: branch, commit, command."""
    info: dict[str, Any] = {
        "name": name,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec,
        "host": host,
        "branch": None,
        "commit": None,
    }
    info.update(extra)
    return info


def finalize_bundle(
    bundle_dir: Path,
    *,
    run: dict[str, Any],
    traces: list[dict[str, Any]],
    workload: dict[str, Any],
    variants: list[dict[str, Any]],
    environment: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Hash the traces, write ``manifest.json`` atomically, and re-read the bundle to check it.

    :raises analyzers.bundle.BundleError: the result would not be a valid bundle.
    """
    entries = []
    for entry in traces:
        path = bundle_dir / entry["path"]
        entries.append({**entry, "sha256": file_sha256(path), "size": path.stat().st_size})
    manifest: dict[str, Any] = {
        "bundle_version": BUNDLE_VERSION,
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "run": run,
        "workload": workload,
        "variants": variants,
        "environment": environment,
        "traces": entries,
        **(extra or {}),
    }
    target = bundle_dir / MANIFEST_NAME
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    read_bundle(bundle_dir).close()  # the writer never emits what the reader refuses
    return target


def _tarinfo(name: str, size: int, *, is_dir: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 0 if is_dir else size
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = 0o755 if is_dir else 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_bundle(bundle_dir: Path, out_path: Path) -> str:
    """Write ``bundle_dir`` as a reproducible ``.tar.gz``; return the archive's sha256.

    Members are the directory's regular files in sorted order, relative to the bundle root (no
    top-level folder); links and special files are refused rather than packed.
    """
    files = sorted(p for p in bundle_dir.rglob("*") if not p.is_dir())
    for p in files:
        if p.is_symlink() or not p.is_file():
            raise ValueError(f"{p}: bundles hold regular files only (links are not packed)")
    if not (bundle_dir / MANIFEST_NAME).is_file():
        raise ValueError(f"{bundle_dir}: no {MANIFEST_NAME}; finalize the bundle first")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with (
        tmp.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        dirs = sorted({p.relative_to(bundle_dir).parent for p in files} - {Path(".")})
        for d in dirs:
            tar.addfile(_tarinfo(d.as_posix(), 0, is_dir=True))
        for p in files:
            rel = p.relative_to(bundle_dir).as_posix()
            with p.open("rb") as fh:
                tar.addfile(_tarinfo(rel, p.stat().st_size, is_dir=False), fh)
    os.replace(tmp, out_path)
    return file_sha256(out_path)
