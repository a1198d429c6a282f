"""Read and validate run bundles: a manifest plus the traces of one run.

A run bundle (format version 1, written by ``runners/bundle.py``, documented in ``docs/bundle.md``)
is a directory, ``.tar`` or ``.tar.gz``::

    manifest.json      RunManifest fields + "bundle_version", "run", "traces"
    traces/<file>      Kineto JSON (one per rank) and/or nsys SQLite exports
    logs/<file>        optional per-rank logs

Bundles arrive from other machines (uploads), so a bundle is untrusted input. The reader refuses
members that would land outside the bundle (absolute paths, ``..``), links, devices and FIFOs,
members larger than a cap, and traces whose sha256 differs from the manifest's. A tar is
extracted into a fresh directory that is removed again if anything fails, so a refused bundle
leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Literal

from analyzers.errors import TraceError
from analyzers.manifest import ManifestError, RunManifest, parse_manifest

BUNDLE_VERSION = 1
MANIFEST_NAME = "manifest.json"
DEFAULT_MAX_MEMBER_BYTES = 2 * 1024**3
"""Largest single member accepted (a 2-rank nsys export of a long run stays well below)."""
DEFAULT_MAX_TOTAL_BYTES = 8 * 1024**3
MAX_MEMBERS = 10_000
MAX_MANIFEST_BYTES = 16 * 1024**2
TRACE_FORMATS = ("kineto", "nsys")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1024 * 1024

TraceFormat = Literal["kineto", "nsys"]


class BundleError(TraceError):
    """The bundle is unreadable, incomplete or does not match its manifest."""


class UnsafeBundleError(BundleError):
    """The bundle holds a member that could escape it or exhaust the disk."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BundleTrace:
    """One trace file listed in the manifest, verified against its sha256."""

    member: str
    """Path inside the bundle (``traces/rank0.json.gz``)."""
    path: Path
    """Where the file is on disk now."""
    format: TraceFormat
    rank: int | None
    """The rank the file holds; None for a file covering several ranks (one nsys export)."""
    sha256: str
    size: int


@dataclass(slots=True, kw_only=True)
class Bundle:
    """A validated bundle. Use as a context manager to remove a tar's extraction directory."""

    root: Path
    """Directory holding ``manifest.json`` (the extraction directory for a tar)."""
    manifest: RunManifest
    bundle_version: int
    run: dict[str, Any]
    """Run info: name, branch, commit, created_at, spec, host."""
    traces: tuple[BundleTrace, ...]
    _temp_dir: Path | None = field(default=None, repr=False)

    def trace_paths(self, fmt: TraceFormat | None = None) -> list[Path]:
        """Paths of the listed traces, optionally of one format, in manifest order."""
        return [t.path for t in self.traces if fmt is None or t.format == fmt]

    def analysis_paths(self) -> list[Path]:
        """The traces to analyze together: the per-rank Kineto files when there are any, else
        the nsys exports. Both formats of one rank must not be merged (they claim one rank)."""
        return self.trace_paths("kineto") or self.trace_paths("nsys")

    def close(self) -> None:
        """Remove the extraction directory this reader created (no-op for a directory)."""
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def __enter__(self) -> Bundle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def is_bundle(path: str | Path) -> bool:
    """True when ``path`` looks like a bundle (a directory with a manifest, or a tar)."""
    p = Path(path)
    if p.is_dir():
        return (p / MANIFEST_NAME).is_file()
    return p.is_file() and p.name.endswith((".tar", ".tar.gz", ".tgz"))


def read_bundle(
    path: str | Path,
    *,
    extract_to: str | Path | None = None,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
) -> Bundle:
    """Open a bundle directory or tar, validate its manifest and verify every listed trace.

    Args:
        path: bundle directory, ``.tar`` or ``.tar.gz``.
        extract_to: parent directory for a tar's extraction (default: the system temp dir).
            A fresh subdirectory is created there; ``Bundle.close()`` removes it.
        max_member_bytes: refuse any member (tar) or listed trace (directory) larger than this.
        max_total_bytes: refuse a tar whose members add up to more than this.

    Returns:
        The validated ``Bundle``; for a tar, close it (or use ``with``) to free the disk.

    Raises:
        UnsafeBundleError: a member escapes the bundle, is a link/device, or is too large.
        BundleError: missing or invalid manifest, missing trace, sha256 mismatch.
    """
    p = Path(path)
    if p.is_dir():
        return _validate(p, source=str(p), max_member_bytes=max_member_bytes, temp_dir=None)
    if not p.is_file():
        raise BundleError(f"{p}: no such bundle (expected a directory, .tar or .tar.gz)")
    temp_dir = Path(tempfile.mkdtemp(prefix="cptrace-bundle-", dir=extract_to))
    try:
        _extract(p, temp_dir, max_member_bytes=max_member_bytes, max_total_bytes=max_total_bytes)
        root = _bundle_root(temp_dir, source=str(p))
        return _validate(root, source=str(p), max_member_bytes=max_member_bytes, temp_dir=temp_dir)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def _safe_member_name(name: str, *, source: str) -> PurePosixPath:
    """The member's relative path, or ``UnsafeBundleError`` if it could land outside."""
    if "\\" in name or "\x00" in name:
        raise UnsafeBundleError(f"{source}: member {name!r}: backslash or NUL in the path")
    pure = PurePosixPath(name)
    if pure.is_absolute():
        raise UnsafeBundleError(f"{source}: member {name!r}: absolute path")
    parts = [part for part in pure.parts if part != "."]
    if ".." in parts:
        raise UnsafeBundleError(f"{source}: member {name!r}: '..' leaves the bundle")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _extract(tar_path: Path, dest: Path, *, max_member_bytes: int, max_total_bytes: int) -> None:
    """Stream the tar into ``dest``, member by member, checking each before writing it."""
    source = str(tar_path)
    total = 0
    seen: set[PurePosixPath] = set()
    try:
        with tarfile.open(tar_path, mode="r:*") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise UnsafeBundleError(f"{source}: more than {MAX_MEMBERS} members")
                rel = _safe_member_name(member.name, source=source)
                if member.isdir():
                    (dest / rel).mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isreg():
                    kind = "link" if member.issym() or member.islnk() else "special file"
                    raise UnsafeBundleError(
                        f"{source}: member {member.name!r} is a {kind}; bundles hold regular "
                        "files only"
                    )
                if rel in seen:
                    raise UnsafeBundleError(f"{source}: member {member.name!r} appears twice")
                seen.add(rel)
                if member.size > max_member_bytes:
                    raise UnsafeBundleError(
                        f"{source}: member {member.name!r} is {member.size} bytes, over the "
                        f"{max_member_bytes}-byte cap"
                    )
                total += member.size
                if total > max_total_bytes:
                    raise UnsafeBundleError(
                        f"{source}: members add up to more than {max_total_bytes} bytes"
                    )
                _copy_member(tar, member, dest / rel, limit=max_member_bytes, source=source)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"{source}: not a readable tar archive: {exc}") from exc


def _copy_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, *, limit: int, source: str
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fileobj = tar.extractfile(member)
    if fileobj is None:
        raise BundleError(f"{source}: member {member.name!r} has no data")
    written = 0
    # O_EXCL: never follow or overwrite something already there.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as out, fileobj:
        while chunk := fileobj.read(_CHUNK):
            written += len(chunk)
            if written > limit:
                raise UnsafeBundleError(f"{source}: member {member.name!r} exceeds {limit} bytes")
            out.write(chunk)


def _bundle_root(extracted: Path, *, source: str) -> Path:
    """The manifest's directory: the top, or the single folder ``tar czf x.tgz dir/`` makes."""
    if (extracted / MANIFEST_NAME).is_file():
        return extracted
    entries = list(extracted.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / MANIFEST_NAME).is_file():
        return entries[0]
    raise BundleError(f"{source}: no {MANIFEST_NAME} at the top of the bundle")


def _validate(root: Path, *, source: str, max_member_bytes: int, temp_dir: Path | None) -> Bundle:
    raw = _load_manifest_json(root, source=source)
    version = raw.get("bundle_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BundleError(f"{source}: field bundle_version: expected an integer, got {version!r}")
    if version > BUNDLE_VERSION:
        raise BundleError(
            f"{source}: bundle_version {version} is newer than this cptrace understands "
            f"({BUNDLE_VERSION}); upgrade cptrace"
        )
    run = raw.get("run", {})
    if not isinstance(run, dict):
        raise BundleError(f"{source}: field run: expected an object")
    try:
        manifest = parse_manifest(raw, source=f"{source}:{MANIFEST_NAME}")
    except ManifestError as exc:
        raise BundleError(str(exc)) from exc
    # A run that failed before its profiler captured anything still has a bundle: its failure
    # record (runners/profile/supervise.py) is the content, so it may list no traces.
    failed = isinstance(raw.get("failure"), dict)
    traces = _check_traces(
        root, raw.get("traces"), source=source, max_bytes=max_member_bytes, allow_empty=failed
    )
    _check_unlisted(root, {t.member for t in traces}, source=source)
    return Bundle(
        root=root,
        manifest=manifest,
        bundle_version=version,
        run=run,
        traces=traces,
        _temp_dir=temp_dir,
    )


def _load_manifest_json(root: Path, *, source: str) -> dict[str, Any]:
    path = root / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        raise BundleError(f"{source}: no {MANIFEST_NAME} at the top of the bundle")
    rel = PurePosixPath(MANIFEST_NAME)
    _require_regular(root, rel, source=source, max_bytes=MAX_MANIFEST_BYTES)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{source}: {MANIFEST_NAME} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise BundleError(f"{source}: {MANIFEST_NAME} must hold a JSON object")
    return raw


def _require_regular(root: Path, rel: PurePosixPath, *, source: str, max_bytes: int) -> int:
    """Check that ``root/rel`` is a regular file reached through no link; return its size."""
    current = root
    for part in rel.parts:
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            raise BundleError(f"{source}: {rel} is listed but missing") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeBundleError(f"{source}: {rel} goes through a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeBundleError(f"{source}: {rel} is not a regular file")
    if st.st_size > max_bytes:
        raise UnsafeBundleError(f"{source}: {rel} is {st.st_size} bytes, over the {max_bytes} cap")
    return st.st_size


def _check_traces(
    root: Path, entries: object, *, source: str, max_bytes: int, allow_empty: bool = False
) -> tuple[BundleTrace, ...]:
    if isinstance(entries, list) and not entries and allow_empty:
        return ()
    if not isinstance(entries, list) or not entries:
        raise BundleError(f"{source}: field traces: expected a non-empty list of trace entries")
    traces = []
    for i, entry in enumerate(entries):
        where = f"{source}: field traces.{i}"
        if not isinstance(entry, dict):
            raise BundleError(f"{where}: expected an object with path, format, rank, sha256")
        member, fmt, rank, digest = (entry.get(k) for k in ("path", "format", "rank", "sha256"))
        if not isinstance(member, str) or not member:
            raise BundleError(f"{where}.path: expected a relative path string")
        rel = _safe_member_name(member, source=source)
        if fmt != "kineto" and fmt != "nsys":
            raise BundleError(f"{where}.format: expected one of {TRACE_FORMATS}, got {fmt!r}")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise BundleError(f"{where}.rank: expected a non-negative integer or null")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise BundleError(f"{where}.sha256: expected 64 lowercase hex digits")
        size = _require_regular(root, rel, source=source, max_bytes=max_bytes)
        actual = file_sha256(root / rel)
        if actual != digest:
            raise BundleError(
                f"{source}: {member}: sha256 {actual} does not match the manifest's {digest}"
            )
        traces.append(
            BundleTrace(
                member=str(rel), path=root / rel, format=fmt, rank=rank, sha256=digest, size=size
            )
        )
    return tuple(traces)


def _check_unlisted(root: Path, listed: set[str], *, source: str) -> None:
    """Every file under ``traces/`` must be in the manifest: an unlisted one is unverified."""
    traces_dir = root / "traces"
    if not traces_dir.is_dir():
        return
    for path in sorted(traces_dir.rglob("*")):
        member = path.relative_to(root).as_posix()
        if not path.is_dir() and member not in listed:
            raise BundleError(f"{source}: {member} is in the bundle but not listed in traces")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
