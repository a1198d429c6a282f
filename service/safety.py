"""Treat every uploaded byte as hostile: capped decompression, tar member checks, trace sniffing.

What this module guards against, and how:

- gzip bombs: ``CappedGzipReader`` counts decompressed bytes and stops at the configured cap.
- tar tricks: members must be plain files or directories under ``manifest.json``, ``traces/`` or
  ``logs/``; absolute paths, ``..``, links and devices are refused. Names are only *labels*: the
  bytes go to content-addressed blobs, never to a path built from a member name.
- hostile nsys SQLite: a file with triggers or views is refused before it is stored (the
  analyzers' readers refuse them too; checking at upload time turns it into a 4xx now instead of
  a failed analysis later).
- truncated gzip and invalid JSON: decoded fully once at upload so the client hears about it.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import sqlite3
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from service.core.errors import BadRequest, PayloadTooLarge, UnprocessableEntity

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
ALLOWED_TOP = ("traces/", "logs/")


class CappedGzipReader:
    """A read-only file object over gzip data that refuses to expand past ``cap`` bytes.

    Handles multi-member gzip streams (``gzip`` concatenation) and reports truncation, which
    ``zlib`` alone would silently accept.
    """

    def __init__(self, raw: IO[bytes], cap: int, *, label: str) -> None:
        self._raw = raw
        self._cap = cap
        self._label = label
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buffer = b""
        self._produced = 0
        self._eof = False
        self._in_member = False
        self._pending = b""

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()

    def _fill(self, want: int) -> None:
        while len(self._buffer) < want and not self._eof:
            if self._inflater.unconsumed_tail:
                data = self._inflater.unconsumed_tail
            elif self._pending:
                data, self._pending = self._pending, b""
            else:
                data = self._raw.read(1 << 16)
                if not data:
                    if self._in_member:
                        raise BadRequest(f"{self._label}: gzip data is truncated")
                    self._eof = True
                    break
            self._in_member = True
            out = self._inflater.decompress(data, 1 << 20)
            self._count(out)
            self._buffer += out
            if self._inflater.eof:
                # Concatenated gzip members are one stream; trailing NUL padding is not a member.
                rest = self._inflater.unused_data
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._in_member = False
                self._pending = rest if rest.strip(b"\x00") else b""

    def _count(self, out: bytes) -> None:
        self._produced += len(out)
        if self._produced > self._cap:
            raise PayloadTooLarge(
                f"{self._label}: decompresses to more than the limit of {self._cap} bytes"
            )

    def read(self, size: int = -1) -> bytes:
        try:
            if size is None or size < 0:
                chunks: list[bytes] = []
                while True:
                    chunk = self.read(1 << 20)
                    if not chunk:
                        return b"".join(chunks)
                    chunks.append(chunk)
            self._fill(size)
        except zlib.error as exc:
            raise BadRequest(f"{self._label}: not valid gzip data ({exc})") from exc
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out


def check_member_name(name: str) -> str:
    """Normalise a tar member name, refusing anything that could leave the bundle."""
    if "\\" in name or "\x00" in name:
        raise BadRequest(f"bundle member {name!r}: backslashes and NUL are not allowed in names")
    if name.startswith("/"):
        raise BadRequest(f"bundle member {name!r}: absolute paths are not allowed")
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../") or "/../" in f"/{name}/":
        raise BadRequest(f"bundle member {name!r}: path traversal ('..') is not allowed")
    if norm.startswith("./"):
        norm = norm[2:]
    return norm


def check_member(member: tarfile.TarInfo, name: str) -> str | None:
    """``name`` (already normalised, root folder stripped) if it is a file member to keep;
    None for directories.

    :raises BadRequest: links, devices, FIFOs, or files outside the bundle layout.
    """
    if member.isdir():
        return None
    if not member.isfile():
        kind = "symlink" if member.issym() else "hard link" if member.islnk() else "special file"
        raise BadRequest(f"bundle member {member.name!r}: {kind}s are not allowed in a bundle")
    if name != "manifest.json" and not name.startswith(ALLOWED_TOP):
        raise BadRequest(
            f"bundle member {member.name!r}: expected manifest.json, traces/<file> or logs/<file>"
        )
    return name


class _RootFolder:
    """Accept ``tar czf b.tgz dir/`` archives: one top folder around the bundle is stripped."""

    def __init__(self) -> None:
        self.prefix: str | None = None

    def strip(self, name: str) -> str:
        first = name.split("/", 1)[0]
        if self.prefix is None:
            bare = first in ("manifest.json", "traces", "logs")
            self.prefix = "" if bare else first + "/"
        if not self.prefix:
            return name
        if name + "/" == self.prefix:
            return "."
        if not name.startswith(self.prefix):
            raise BadRequest(f"bundle member {name!r}: outside the bundle folder {self.prefix!r}")
        return name[len(self.prefix) :]


def iter_tar_members(
    fileobj: IO[bytes], *, max_members: int
) -> Iterator[tuple[str, tarfile.TarInfo, IO[bytes]]]:
    """Stream ``(name, info, reader)`` for every file member of an uncompressed tar stream."""
    root = _RootFolder()
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for count, member in enumerate(tar, start=1):
                if count > max_members:
                    raise BadRequest(f"bundle holds more than {max_members} members")
                name = root.strip(check_member_name(member.name))
                if name == "." or check_member(member, name) is None:
                    continue
                reader = tar.extractfile(member)
                assert reader is not None  # isfile() was checked
                yield name, member, reader
    except tarfile.TarError as exc:
        raise BadRequest(f"bundle: not a valid tar archive ({exc})") from exc


@dataclass(frozen=True, slots=True)
class TraceKind:
    """What a stored trace is: ``nsys`` or ``kineto``, gzipped or not."""

    format: str
    gzipped: bool

    @property
    def suffix(self) -> str:
        """File suffix the readers expect."""
        base = ".sqlite" if self.format == "nsys" else ".json"
        return base + (".gz" if self.gzipped else "")


def _open_maybe_gzip(path: Path, cap: int, label: str) -> tuple[IO[bytes], bool]:
    raw = path.open("rb")
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        return CappedGzipReader(raw, cap, label=label), True  # type: ignore[return-value]
    raw.seek(0)
    return raw, False


def sniff_trace(path: Path, *, cap: int, label: str) -> TraceKind:
    """Decide the trace format from content (never from the name)."""
    reader, gzipped = _open_maybe_gzip(path, cap, label)
    with contextlib.closing(reader):
        head = reader.read(64)
    if head.startswith(SQLITE_MAGIC):
        return TraceKind("nsys", gzipped)
    if head.lstrip()[:1] in (b"{", b"["):
        return TraceKind("kineto", gzipped)
    raise UnprocessableEntity(
        f"{label}: not a supported trace (expected an Nsight Systems SQLite export or a PyTorch "
        "profiler JSON trace, optionally gzipped)"
    )


def validate_trace(path: Path, kind: TraceKind, *, cap: int, label: str, tmp_dir: Path) -> None:
    """Decode the whole trace once so bad input is refused at upload, not at analysis."""
    if kind.format == "kineto":
        _validate_json(path, cap=cap, label=label)
    else:
        _validate_sqlite(path, kind, cap=cap, label=label, tmp_dir=tmp_dir)


def _validate_json(path: Path, *, cap: int, label: str) -> None:
    reader, _ = _open_maybe_gzip(path, cap, label)
    with contextlib.closing(reader):
        data = reader.read()
    try:
        json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"{label}: invalid JSON ({exc})") from exc


def _validate_sqlite(path: Path, kind: TraceKind, *, cap: int, label: str, tmp_dir: Path) -> None:
    plain = path
    temp: Path | None = None
    if kind.gzipped:
        reader, _ = _open_maybe_gzip(path, cap, label)
        temp = tmp_dir / f"check-{path.name}.sqlite"
        with contextlib.closing(reader), temp.open("wb") as out:
            while chunk := reader.read(1 << 20):
                out.write(chunk)
        plain = temp
    try:
        check_sqlite_file(plain, label=label)
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)


def check_sqlite_file(path: Path, *, label: str) -> None:
    """Open read-only, refuse triggers and views, and make sure it is a readable nsys export.

    Runs the analyzers' own nsys validation too when it is importable, so the rules stay one.
    """
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as exc:
        raise BadRequest(f"{label}: cannot open SQLite file ({exc})") from exc
    try:
        conn.execute("PRAGMA trusted_schema = OFF")
        found = conn.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view') ORDER BY name"
        ).fetchall()
        if found:
            what = ", ".join(f"{t} {n!r}" for t, n in found)
            raise UnprocessableEntity(
                f"{label}: SQLite file holds {what}; triggers and views are refused in uploaded "
                "traces (an Nsight Systems export has none)"
            )
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables and "StringIds" not in tables:
            raise UnprocessableEntity(
                f"{label}: SQLite file is not an Nsight Systems export (no "
                "CUPTI_ACTIVITY_KIND_KERNEL"
                " or StringIds table)"
            )
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise BadRequest(f"{label}: SQLite file is corrupt (quick_check failed)")
    except sqlite3.DatabaseError as exc:
        raise BadRequest(f"{label}: not a readable SQLite file ({exc})") from exc
    finally:
        conn.close()
    _analyzer_check(path, label)


def _analyzer_check(path: Path, label: str) -> None:
    """Run the nsys reader's own schema guard (the same rules the analysis will apply)."""
    try:
        from analyzers.errors import TraceError
        from analyzers.readers import _sqlite_guard as guard
    except ImportError:  # analyzers without the guard: the checks above still hold
        return
    try:
        conn = guard.open_readonly(path)
        try:
            guard.inspect_schema(conn, path, set())
        finally:
            conn.close()
    except TraceError as exc:
        raise UnprocessableEntity(f"{label}: {str(exc).replace(str(path), 'file')}") from exc


def gunzip_bytes(data: bytes, *, cap: int, label: str) -> bytes:
    """Small helper for tests and the seed: capped gunzip of in-memory bytes."""
    import io

    if not data.startswith(GZIP_MAGIC):
        return data
    return CappedGzipReader(io.BytesIO(data), cap, label=label).read()


__all__ = [
    "CappedGzipReader",
    "TraceKind",
    "check_member",
    "check_sqlite_file",
    "gunzip_bytes",
    "iter_tar_members",
    "sniff_trace",
    "validate_trace",
]
