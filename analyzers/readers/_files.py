"""File-level helpers shared by the readers, the bundle reader and the service: content
sniffing and bounded gzip decompression (the one copy of each).

Why sniff content instead of trusting extensions: traces arrive through uploads and bundles
whose file names are whatever the runner or the user chose (``rank0.trace``, ``profile.gz``),
and a saved ``cptrace analyze --json`` report may be named anything too.
Why a size cap on decompression: a gzip member of a few MB can expand to many GB (a "zip bomb");
an uploaded trace must not be able to fill the disk of the analysis worker.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, BinaryIO, Literal

from analyzers.errors import CorruptTraceError, TraceTooLargeError, UnsupportedTraceError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"

DEFAULT_MAX_DECOMPRESSED = 64 << 30
"""Largest decompressed trace accepted (64 GiB); override with CPTRACE_MAX_DECOMPRESSED_BYTES."""

_COPY_CHUNK = 4 << 20

Kind = Literal["sqlite", "json", "nsys-rep", "report"]
"""What a file holds: an nsys SQLite export, trace JSON (Kineto/Chrome), a ``.nsys-rep``
container, or a saved cptrace ``AnalysisReport`` (JSON too, told apart by its first keys)."""

TraceFormat = Literal["kineto", "nsys"]
"""The trace formats a bundle lists and the service stores."""

FORMAT_OF_KIND: dict[Kind, TraceFormat | None] = {
    "json": "kineto",
    "sqlite": "nsys",
    "nsys-rep": "nsys",
    "report": None,
}
"""The bundle/service trace format of each sniffed kind (a report is no trace format)."""

_REPORT_HEAD = re.compile(rb'^\{\s*"schema_version"\s*:\s*\d+\s*,\s*"catalog_version"\s*:')
"""How ``AnalysisReport.model_dump_json`` (indented or not) begins; no trace begins so."""
SNIFF_BYTES = 256


def max_decompressed_bytes() -> int:
    """The decompression cap in bytes, from the environment or the default."""
    raw = os.environ.get("CPTRACE_MAX_DECOMPRESSED_BYTES")
    if raw is None:
        return DEFAULT_MAX_DECOMPRESSED
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(
            f"CPTRACE_MAX_DECOMPRESSED_BYTES={raw!r}: expected an integer number of bytes"
        ) from exc


def read_head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    """First ``size`` bytes of the file, decompressed when it is gzip."""
    with open(path, "rb") as raw:
        head = raw.read(size)
    if not head.startswith(GZIP_MAGIC):
        return head
    try:
        with gzip.open(path, "rb") as unzipped:
            return unzipped.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptTraceError(f"{path}: gzip stream is truncated or damaged ({exc})") from exc


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes."""
    with open(path, "rb") as raw:
        return raw.read(2) == GZIP_MAGIC


def sniff(path: Path, *, label: str | None = None) -> Kind:
    """Decide what the file holds from its content (decompressing gzip), not its name.

    The only name consulted is a ``.nsys-rep`` suffix, and only for content that is neither
    SQLite nor JSON: that binary container is opaque to everything but ``nsys`` itself.

    :raises UnsupportedTraceError: the content is neither SQLite nor JSON.
    :raises CorruptTraceError: the file is empty or its gzip stream is damaged.
    """
    return sniff_head(read_head(path), name=path.name, label=label or str(path))


def sniff_head(head: bytes, *, name: str, label: str) -> Kind:
    """``sniff`` on the first (decompressed) bytes of a file called ``name``."""
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if _REPORT_HEAD.match(stripped):
        return "report"
    if stripped[:1] in (b"{", b"["):
        return "json"
    if name.endswith(".nsys-rep"):
        return "nsys-rep"
    if not head:
        raise CorruptTraceError(f"{label}: file is empty (no events)")
    raise UnsupportedTraceError(
        f"{label}: not a supported trace: expected an Nsight Systems SQLite export (header "
        f"'SQLite format 3'), a .nsys-rep, PyTorch profiler JSON or a saved cptrace report, "
        f"optionally gzipped; got bytes {head[:16]!r}"
    )


class CappedGunzip:
    """A read-only stream over gzip data that refuses to expand past ``cap`` bytes.

    Reads concatenated gzip members as one stream (``gzip`` does), ignores trailing NUL padding,
    and reports truncation, which ``zlib`` alone would silently accept. Used for the outer
    gzip of a bundle and for the upload check of gzipped traces.
    """

    def __init__(self, raw: IO[bytes], cap: int, *, label: str) -> None:
        self._raw = raw
        self._cap = cap
        self._label = label
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buffer = bytearray()
        self._produced = 0
        self._eof = False
        self._in_member = False
        self._pending = b""

    @property
    def produced(self) -> int:
        """Decompressed bytes produced so far."""
        return self._produced

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while chunk := self.read(_COPY_CHUNK):
                chunks.append(chunk)
            return b"".join(chunks)
        try:
            self._fill(size)
        except zlib.error as exc:
            raise CorruptTraceError(f"{self._label}: not valid gzip data ({exc})") from exc
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

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
                        raise CorruptTraceError(f"{self._label}: gzip data is truncated")
                    self._eof = True
                    break
            self._in_member = True
            out = self._inflater.decompress(data, 1 << 20)
            self._produced += len(out)
            if self._produced > self._cap:
                raise TraceTooLargeError(
                    f"{self._label}: decompresses to more than the limit of {self._cap} bytes "
                    "(the cap)"
                )
            self._buffer += out
            if self._inflater.eof:
                rest = self._inflater.unused_data
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._in_member = False
                self._pending = rest if rest.strip(b"\x00") else b""


def open_maybe_gzip(raw: IO[bytes], cap: int, *, label: str) -> tuple[IO[bytes], bool]:
    """``raw`` itself, or a ``CappedGunzip`` over it when it starts with the gzip magic; and
    whether it was gzip. ``raw`` must be seekable (a file)."""
    gzipped = raw.read(2) == GZIP_MAGIC
    raw.seek(0)
    if gzipped:
        return CappedGunzip(raw, cap, label=label), True  # type: ignore[return-value]
    return raw, False


@contextlib.contextmanager
def decompressed_copy(path: Path, max_bytes: int | None = None) -> Iterator[Path]:
    """Decompress a gzip file into a private temporary file, removed on exit.

    SQLite needs a real file to open, so a ``.sqlite.gz`` export cannot be streamed.

    :raises CorruptTraceError: the gzip stream is truncated or damaged.
    :raises TraceTooLargeError: the decompressed size exceeds ``max_bytes``.
    """
    limit = max_decompressed_bytes() if max_bytes is None else max_bytes
    fd, name = tempfile.mkstemp(prefix="cptrace-", suffix=".sqlite")
    target = Path(name)
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as src:
            _copy_capped(src, out, limit, path)
        yield target
    finally:
        target.unlink(missing_ok=True)


def _copy_capped(src: gzip.GzipFile, out: BinaryIO, limit: int, path: Path) -> None:
    written = 0
    try:
        while chunk := src.read(_COPY_CHUNK):
            written += len(chunk)
            if written > limit:
                raise TraceTooLargeError(
                    f"{path}: decompresses to more than the limit of {limit} bytes (the cap); "
                    "raise CPTRACE_MAX_DECOMPRESSED_BYTES if this trace is genuine"
                )
            out.write(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise CorruptTraceError(
            f"{path}: gzip stream is truncated or damaged after {written} bytes ({exc})"
        ) from exc
