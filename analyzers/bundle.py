"""Read and validate run bundles: a manifest plus the traces of one run (the one bundle reader).

A run bundle (format version 1, written by ``runners/bundle.py``, documented in ``docs/bundle.md``)
is a directory, ``.tar`` or ``.tar.gz``::

    manifest.json      RunManifest fields + "bundle_version", "run", "traces"
    traces/<file>      Kineto JSON (one per rank) and/or nsys SQLite exports
    logs/<file>        optional per-rank logs

The service (uploads), the analysis worker and the CLI all read bundles here. An archive is read
once, front to back, from a file object (``read_bundle_stream``): every member is checked before
its bytes go anywhere (names, types, sizes, the decompression cap), hashed on the way and written
to a ``MemberSink`` (the service's blob store, or a directory for the CLI); the manifest is parsed
once, strictly, into the typed model; each trace's format comes from the readers' one sniffer.

Bundles arrive from other machines, so a bundle is untrusted input: members that would land
outside the bundle (absolute paths, ``..``), links, devices and FIFOs, members outside the layout,
members larger than a cap, duplicates, and traces whose sha256 differs from the manifest's are
refused. A refused tar leaves nothing behind (``read_bundle`` removes its directory; a sink's
owner discards what it was given).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import IO, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from analyzers.errors import CorruptTraceError, TraceError, TraceTooLargeError
from analyzers.manifest import (
    MAX_MANIFEST_BYTES,
    ManifestError,
    RunManifest,
    load_json_strict,
    parse_manifest,
)
from analyzers.readers import (
    FORMAT_OF_KIND,
    GZIP_MAGIC,
    CappedGunzip,
    Kind,
    TraceFormat,
    TraceInput,
    is_gzip,
    sniff,
)
from contracts.validation import first_error

BUNDLE_VERSION = 1
MANIFEST_NAME = "manifest.json"
DEFAULT_MAX_MEMBER_BYTES = 2 * 1024**3
"""Largest single member accepted (a 2-rank nsys export of a long run stays well below)."""
DEFAULT_MAX_TOTAL_BYTES = 8 * 1024**3
MAX_MEMBERS = 10_000
MAX_MEMBER_NAME = 1024
"""Longest member path accepted (characters). A bundle's members are ``manifest.json`` and
``traces/<file>``; a name of megabytes is an attack on every message and log that repeats it."""
LAYOUT_DIRS = ("traces/", "logs/")
TRACE_FORMATS = ("kineto", "nsys")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1024 * 1024
_TAR_OVERHEAD = 1024
"""Tar bytes per member beyond its data (header + padding), for the stream's decompression cap."""

T = TypeVar("T")


class BundleError(TraceError):
    """The bundle is unreadable, incomplete or does not match its manifest."""


class UnsafeBundleError(BundleError):
    """The bundle holds a member that could escape it or exhaust the disk."""


class OversizedBundleError(UnsafeBundleError, TraceTooLargeError):
    """A member, or the bundle, is (or expands) past its size cap."""


class BundleManifestError(BundleError, ManifestError):
    """The manifest is valid JSON but its content is wrong (a field, a listed trace, a sha256)."""


class MemberSink(Protocol):
    """Where the bundle reader writes each member's bytes (already checked, being hashed)."""

    def put(self, member: str, chunks: Iterable[bytes]) -> Path:
        """Consume ``chunks`` (the member's bytes) and return the file now holding them."""
        ...


class DirectorySink:
    """Members as files under ``root`` (the CLI's extraction). Never overwrites anything."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, member: str, chunks: Iterable[bytes]) -> Path:
        target = self.root / member
        target.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never follow or overwrite something already there.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
        return target


class RunInfo(BaseModel):
    """The manifest's ``run`` block: who ran what, where. Strings are length-capped."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(default=None, max_length=200)
    branch: str | None = Field(default=None, max_length=255)
    commit: str | None = Field(default=None, max_length=100)
    created_at: str | None = Field(default=None, max_length=64)
    host: str | None = Field(default=None, max_length=255)
    spec: dict[str, Any] | None = None
    """The workload spec the run executed (the YAML's content)."""
    caveat: str | None = Field(default=None, max_length=2000)
    """What a reader must know before trusting the run's figures (a capture with code that has
    changed since); the run page and the history show it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BundleFile:
    """A member of the bundle, hashed."""

    member: str
    """Path inside the bundle (``traces/rank0.json.gz``); a label, never a path to open."""
    path: Path
    """Where the bytes are now (extraction directory, sink file, or the bundle directory)."""
    sha256: str
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BundleTrace(BundleFile):
    """One trace file listed in the manifest, verified against its sha256."""

    format: TraceFormat
    rank: int | None
    """The rank the file holds; None for a file covering several ranks (one nsys export)."""
    gzipped: bool = False
    kind: Kind | None = None
    """What the content holds, as sniffed when the manifest's format was checked (so the
    upload check and the readers need not sniff again)."""

    def as_input(self, label: str | None = None) -> TraceInput:
        """This trace as the analysis' typed input (``label``: its name in the report)."""
        return TraceInput(
            path=self.path, format=self.format, gzipped=self.gzipped, rank=self.rank, label=label
        )


def select_analysis_traces(items: Sequence[T], format_of: Callable[[T], str]) -> list[T]:
    """The one rule for which traces of a run are analysed together: the per-rank Kineto files
    when there are any, else the rest (the nsys exports). Both formats of one rank must not be
    merged: they claim the same ranks. ``format_of`` gives an item's format (``kineto...``)."""
    kineto = [item for item in items if format_of(item).startswith("kineto")]
    return kineto or list(items)


@dataclass(slots=True, kw_only=True)
class Bundle:
    """A validated bundle. Use as a context manager to remove a tar's extraction directory."""

    root: Path | None
    """Directory holding the members (None when they went to a sink of the caller's)."""
    manifest: RunManifest
    manifest_json: dict[str, Any]
    """The manifest as decoded (strict JSON), for storing it as uploaded."""
    manifest_file: BundleFile | None
    bundle_version: int
    run: RunInfo
    traces: tuple[BundleTrace, ...]
    logs: tuple[BundleFile, ...] = ()
    _temp_dir: Path | None = field(default=None, repr=False)

    def trace_paths(self, fmt: TraceFormat | None = None) -> list[Path]:
        """Paths of the listed traces, optionally of one format, in manifest order."""
        return [t.path for t in self.traces if fmt is None or t.format == fmt]

    def analysis_traces(self) -> list[BundleTrace]:
        """The traces to analyze together (``select_analysis_traces``)."""
        return select_analysis_traces(self.traces, lambda t: t.format)

    def analysis_paths(self) -> list[Path]:
        """Paths of ``analysis_traces``."""
        return [t.path for t in self.analysis_traces()]

    def close(self) -> None:
        """Remove the extraction directory this reader created (no-op otherwise)."""
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
        BundleManifestError: a manifest field, a listed trace or a sha256 is wrong.
        BundleError: missing or unreadable manifest, not a tar.
    """
    p = Path(path)
    if p.is_dir():
        return _read_directory(p, max_member_bytes=max_member_bytes)
    if not p.is_file():
        raise BundleError(f"{p}: no such bundle (expected a directory, .tar or .tar.gz)")
    temp_dir = Path(tempfile.mkdtemp(prefix="cptrace-bundle-", dir=extract_to))
    try:
        with p.open("rb") as raw:
            bundle = read_bundle_stream(
                raw,
                sink=DirectorySink(temp_dir),
                source=str(p),
                max_member_bytes=max_member_bytes,
                max_total_bytes=max_total_bytes,
            )
        bundle.root = temp_dir
        bundle._temp_dir = temp_dir
        return bundle
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def read_bundle_stream(
    fileobj: IO[bytes],
    *,
    sink: MemberSink,
    source: str = "bundle",
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_members: int = MAX_MEMBERS,
) -> Bundle:
    """Read a ``.tar`` or ``.tar.gz`` bundle once from ``fileobj``, writing members to ``sink``.

    Each member is checked before its bytes are read (layout, type, size), hashed while it
    streams into the sink, and the manifest (kept in memory, at most ``MAX_MANIFEST_BYTES``) is
    parsed once after the last member. ``source`` names the bundle in messages.

    Raises: as ``read_bundle``. What the sink was given before an error is the caller's to
    discard.
    """
    head = fileobj.read(2)
    raw: IO[bytes] = _Prefixed(head, fileobj)  # type: ignore[assignment]
    stream_cap = max_total_bytes + max_members * _TAR_OVERHEAD
    stream: IO[bytes] = (
        CappedGunzip(raw, stream_cap, label=source)  # type: ignore[assignment]
        if head == GZIP_MAGIC
        else raw
    )
    members: dict[str, BundleFile] = {}
    manifest_bytes: bytes | None = None
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            walk = _MemberWalk(source, max_member_bytes, max_total_bytes, max_members)
            for member in tar:
                name = walk.check(member)
                if name is None:
                    continue
                reader = tar.extractfile(member)
                if reader is None:
                    raise BundleError(f"{source}: member {member.name!r} has no data")
                keep = name == MANIFEST_NAME
                meter = _Meter(reader, name, limit=max_member_bytes, source=source, keep=keep)
                path = sink.put(name, meter.chunks())
                members[name] = BundleFile(
                    member=name, path=path, sha256=meter.sha256(), size=meter.size
                )
                if keep:
                    manifest_bytes = meter.kept()
    except (tarfile.TarError, CorruptTraceError) as exc:  # CorruptTraceError: the outer gzip
        detail = str(exc).removeprefix(f"{source}: ")
        raise BundleError(f"{source}: not a readable tar archive ({detail})") from exc
    if manifest_bytes is None:
        raise BundleError(f"{source}: no {MANIFEST_NAME} at the top of the bundle")
    return _assemble(
        manifest_bytes,
        source=source,
        manifest_file=members[MANIFEST_NAME],
        lookup=lambda member: members.get(member),
        trace_members=[m for m in members if m.startswith("traces/")],
        logs=tuple(f for m, f in members.items() if m.startswith("logs/")),
        root=None,
    )


class _Prefixed:
    """A read-only stream that first returns ``head`` (already read to sniff gzip)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        if self._head:
            out, self._head = self._head, b""
            if size is not None and 0 <= size <= len(out):
                out, self._head = out[:size], out[size:]
                return out
            more = self._rest.read(-1 if size is None or size < 0 else size - len(out))
            return out + more
        return self._rest.read(size)

    def close(self) -> None:
        """The caller owns the underlying file."""


class _Meter:
    """Streams a member's bytes, hashing and counting them, refusing past ``limit``."""

    def __init__(
        self, reader: IO[bytes], member: str, *, limit: int, source: str, keep: bool
    ) -> None:
        self._reader = reader
        self._member = member
        self._limit = min(limit, MAX_MANIFEST_BYTES) if keep else limit
        self._source = source
        self._digest = hashlib.sha256()
        self._kept: list[bytes] | None = [] if keep else None
        self.size = 0

    def chunks(self) -> Iterator[bytes]:
        while chunk := self._reader.read(_CHUNK):
            self.size += len(chunk)
            if self.size > self._limit:
                raise OversizedBundleError(
                    f"{self._source}: member {self._member!r} is over the {self._limit}-byte cap "
                    "(the limit per member)"
                )
            self._digest.update(chunk)
            if self._kept is not None:
                self._kept.append(chunk)
            yield chunk

    def sha256(self) -> str:
        return self._digest.hexdigest()

    def kept(self) -> bytes:
        return b"".join(self._kept or [])


class _MemberWalk:
    """The checks every tar member passes before its bytes are read."""

    def __init__(self, source: str, max_member: int, max_total: int, max_members: int) -> None:
        self.source = source
        self.max_member = max_member
        self.max_total = max_total
        self.max_members = max_members
        self.count = 0
        self.total = 0
        self.prefix: str | None = None
        self.seen: set[str] = set()

    def check(self, member: tarfile.TarInfo) -> str | None:
        """The member's bundle-relative name if it is a file to read; None to skip (dirs)."""
        source = self.source
        self.count += 1
        if self.count > self.max_members:
            raise UnsafeBundleError(f"{source}: more than {self.max_members} members")
        name = self._strip(str(_safe_member_name(member.name, source=source)))
        if member.isdir() or name == ".":
            return None
        if not member.isreg():
            kind = (
                "link (symlink)"
                if member.issym()
                else "link (hard link)"
                if member.islnk()
                else "special file"
            )
            raise UnsafeBundleError(
                f"{source}: member {member.name!r} is a {kind}; bundles hold regular files only"
            )
        if name != MANIFEST_NAME and not name.startswith(LAYOUT_DIRS):
            raise UnsafeBundleError(
                f"{source}: member {member.name!r}: expected manifest.json, traces/<file> or "
                "logs/<file>"
            )
        if name in self.seen:
            raise UnsafeBundleError(f"{source}: member {member.name!r} appears twice")
        self.seen.add(name)
        if member.size > self.max_member:
            raise OversizedBundleError(
                f"{source}: member {member.name!r} is {member.size} bytes, over the "
                f"{self.max_member}-byte cap (the limit per member)"
            )
        self.total += member.size
        if self.total > self.max_total:
            raise OversizedBundleError(
                f"{source}: members add up to more than {self.max_total} bytes (the limit)"
            )
        return name

    def _strip(self, name: str) -> str:
        """Accept ``tar czf b.tgz dir/``: one top folder around the bundle is stripped."""
        first = name.split("/", 1)[0]
        if self.prefix is None:
            bare = first in (MANIFEST_NAME, "traces", "logs", ".")
            self.prefix = "" if bare else first + "/"
        if not self.prefix:
            return name
        if name + "/" == self.prefix:
            return "."
        if not name.startswith(self.prefix):
            raise UnsafeBundleError(
                f"{self.source}: member {name!r} is outside the bundle folder {self.prefix!r}"
            )
        return name[len(self.prefix) :]


def _safe_member_name(name: str, *, source: str) -> PurePosixPath:
    """The member's relative path, or ``UnsafeBundleError`` if it could land outside."""
    if len(name) > MAX_MEMBER_NAME:
        raise UnsafeBundleError(
            f"{source}: a member name of {len(name)} characters, over the {MAX_MEMBER_NAME}-"
            f"character limit ({name[:60]!r}...)"
        )
    if "\\" in name or "\x00" in name:
        raise UnsafeBundleError(f"{source}: member {name!r}: backslash or NUL in the path")
    pure = PurePosixPath(name)
    if pure.is_absolute():
        raise UnsafeBundleError(f"{source}: member {name!r}: absolute path")
    parts = [part for part in pure.parts if part != "."]
    if ".." in parts:
        raise UnsafeBundleError(
            f"{source}: member {name!r}: path traversal, '..' leaves the bundle"
        )
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _read_directory(root: Path, *, max_member_bytes: int) -> Bundle:
    """A bundle directory: members are read (hashed) in place; nothing is copied."""
    source = str(root)
    path = root / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        raise BundleError(f"{source}: no {MANIFEST_NAME} at the top of the bundle")
    size = _require_regular(
        root, PurePosixPath(MANIFEST_NAME), source=source, max_bytes=MAX_MANIFEST_BYTES
    )
    data = path.read_bytes()

    def lookup(member: str) -> BundleFile | None:
        rel = _safe_member_name(member, source=source)
        size = _require_regular(root, rel, source=source, max_bytes=max_member_bytes)
        target = root / rel
        return BundleFile(member=str(rel), path=target, sha256=file_sha256(target), size=size)

    traces_dir = root / "traces"
    unlisted = (
        [p.relative_to(root).as_posix() for p in sorted(traces_dir.rglob("*")) if not p.is_dir()]
        if traces_dir.is_dir()
        else []
    )
    return _assemble(
        data,
        source=source,
        manifest_file=BundleFile(
            member=MANIFEST_NAME, path=path, sha256=hashlib.sha256(data).hexdigest(), size=size
        ),
        lookup=lookup,
        trace_members=unlisted,
        logs=(),
        root=root,
    )


def _assemble(
    manifest_bytes: bytes,
    *,
    source: str,
    manifest_file: BundleFile,
    lookup: Callable[[str], BundleFile | None],
    trace_members: list[str],
    logs: tuple[BundleFile, ...],
    root: Path | None,
) -> Bundle:
    """Parse the manifest once and match its trace list against the members."""
    where = f"{source}:{MANIFEST_NAME}"
    try:
        raw = load_json_strict(manifest_bytes, source=where)
    except ManifestError as exc:
        raise BundleError(str(exc)) from exc
    if not isinstance(raw, dict):
        raise BundleError(f"{source}: {MANIFEST_NAME} must hold a JSON object")
    version = raw.get("bundle_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BundleManifestError(
            f"{source}: field bundle_version: expected an integer, got {version!r}"
        )
    if version > BUNDLE_VERSION:
        raise BundleManifestError(
            f"{source}: bundle_version {version} is newer than this cptrace understands "
            f"({BUNDLE_VERSION}); upgrade cptrace"
        )
    run = _run_info(raw.get("run", {}), source=where)
    try:
        manifest = parse_manifest(raw, source=where)
    except ManifestError as exc:
        raise BundleManifestError(str(exc)) from exc
    # A run that failed before its profiler captured anything still has a bundle: its failure
    # record (runners/profile/supervise.py) is the content, so it may list no traces.
    failed = isinstance(raw.get("failure"), dict)
    traces = _match_traces(raw.get("traces"), lookup, source=source, allow_empty=failed)
    listed = {t.member for t in traces}
    for member in trace_members:
        if member not in listed:
            raise BundleManifestError(
                f"{source}: {member} is in the bundle but not listed in traces"
            )
    return Bundle(
        root=root,
        manifest=manifest,
        manifest_json=raw,
        manifest_file=manifest_file,
        bundle_version=version,
        run=run,
        traces=traces,
        logs=logs,
    )


def _run_info(raw: object, *, source: str) -> RunInfo:
    if not isinstance(raw, dict):
        raise BundleManifestError(f"{source}: field run: expected an object")
    try:
        return RunInfo.model_validate(raw)
    except ValidationError as exc:
        first = first_error(exc)
        where = first.where("")
        raise BundleManifestError(f"{source}: field run.{where}: {first.message}") from exc


def _match_traces(
    entries: object,
    lookup: Callable[[str], BundleFile | None],
    *,
    source: str,
    allow_empty: bool = False,
) -> tuple[BundleTrace, ...]:
    if isinstance(entries, list) and not entries and allow_empty:
        return ()
    if not isinstance(entries, list) or not entries:
        raise BundleManifestError(
            f"{source}: field traces: expected a non-empty list of trace entries"
        )
    traces = []
    for i, entry in enumerate(entries):
        where = f"{source}: field traces.{i}"
        if not isinstance(entry, dict):
            raise BundleManifestError(
                f"{where}: expected an object with path, format, rank, sha256"
            )
        member, fmt, rank, digest = (entry.get(k) for k in ("path", "format", "rank", "sha256"))
        if not isinstance(member, str) or not member:
            raise BundleManifestError(f"{where}.path: expected a relative path string")
        rel = str(_safe_member_name(member, source=source))
        if fmt != "kineto" and fmt != "nsys":
            raise BundleManifestError(
                f"{where}.format: expected one of {TRACE_FORMATS}, got {fmt!r}"
            )
        if rank is not None and (
            not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < 2**31
        ):
            raise BundleManifestError(f"{where}.rank: expected a non-negative integer or null")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise BundleManifestError(f"{where}.sha256: expected 64 lowercase hex digits")
        found = lookup(rel)
        if found is None:
            raise BundleManifestError(f"{source}: {rel} is listed but missing")
        if found.sha256 != digest:
            raise BundleManifestError(
                f"{source}: {member}: sha256 {found.sha256} does not match the manifest's {digest}"
            )
        kind = sniff(found.path, label=f"{source}: {rel}")
        if FORMAT_OF_KIND[kind] != fmt:
            raise BundleManifestError(
                f"{where}.format: the manifest says {fmt!r} but {rel} holds {kind}"
            )
        traces.append(
            BundleTrace(
                member=rel,
                path=found.path,
                sha256=digest,
                size=found.size,
                format=fmt,
                rank=rank,
                gzipped=is_gzip(found.path),
                kind=kind,
            )
        )
    _refuse_listed_twice(traces, source)
    return tuple(traces)


def _refuse_listed_twice(traces: Sequence[BundleTrace], source: str) -> None:
    """Two files of one format listed with the same rank would each be read as that rank (a
    per-rank nsys export takes its listed rank): refused here, naming both, before any read."""
    claimed: dict[tuple[str, int], str] = {}
    for trace in traces:
        if trace.rank is None:
            continue
        other = claimed.setdefault((trace.format, trace.rank), trace.member)
        if other != trace.member:
            raise BundleManifestError(
                f"{source}: {other} and {trace.member} are both listed as {trace.format} "
                f"rank {trace.rank}: each rank has one file of a format"
            )


def _require_regular(root: Path, rel: PurePosixPath, *, source: str, max_bytes: int) -> int:
    """Check that ``root/rel`` is a regular file reached through no link; return its size."""
    current = root
    for part in rel.parts:
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            raise BundleManifestError(f"{source}: {rel} is listed but missing") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeBundleError(f"{source}: {rel} goes through a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeBundleError(f"{source}: {rel} is not a regular file")
    if st.st_size > max_bytes:
        raise OversizedBundleError(
            f"{source}: {rel} is {st.st_size} bytes, over the {max_bytes}-byte cap (the limit)"
        )
    return st.st_size


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
