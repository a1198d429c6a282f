"""File-level helpers shared by the readers: content sniffing and bounded gzip decompression.

Why sniff content instead of trusting extensions: traces arrive through uploads and bundles
whose file names are whatever the runner or the user chose (``rank0.trace``, ``profile.gz``).
Why a size cap on decompression: a gzip member of a few MB can expand to many GB (a "zip bomb");
an uploaded trace must not be able to fill the disk of the analysis worker.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal

from analyzers.errors import CorruptTraceError, HostileTraceError, UnsupportedTraceError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"

DEFAULT_MAX_DECOMPRESSED = 64 << 30
"""Largest decompressed trace accepted (64 GiB); override with CPTRACE_MAX_DECOMPRESSED_BYTES."""

_COPY_CHUNK = 4 << 20

Kind = Literal["sqlite", "json", "nsys-rep"]


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


def read_head(path: Path, size: int = 64) -> bytes:
    """First ``size`` bytes of the file, decompressed when it is gzip."""
    with open(path, "rb") as raw:
        head = raw.read(size)
    if not head.startswith(GZIP_MAGIC):
        return head
    try:
        with gzip.open(path, "rb") as unzipped:
            return unzipped.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptTraceError(f"{path}: gzip stream is damaged ({exc})") from exc


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes."""
    with open(path, "rb") as raw:
        return raw.read(2) == GZIP_MAGIC


def sniff(path: Path) -> Kind:
    """Decide the trace format from the content (decompressing gzip), not the extension.

    :raises UnsupportedTraceError: the content is neither SQLite nor JSON.
    :raises CorruptTraceError: the file is empty or its gzip stream is damaged.
    """
    if path.name.endswith(".nsys-rep"):
        return "nsys-rep"  # a binary container only nsys itself can read
    head = read_head(path)
    if not head:
        raise CorruptTraceError(f"{path}: file is empty (no events)")
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped[:1] in (b"{", b"["):
        return "json"
    raise UnsupportedTraceError(
        f"{path}: not a trace: expected an Nsight Systems SQLite export (header "
        f"'SQLite format 3'), a .nsys-rep, or PyTorch profiler JSON; got bytes {head[:16]!r}"
    )


@contextlib.contextmanager
def decompressed_copy(path: Path, max_bytes: int | None = None) -> Iterator[Path]:
    """Decompress a gzip file into a private temporary file, removed on exit.

    SQLite needs a real file to open, so a ``.sqlite.gz`` export cannot be streamed.

    :raises CorruptTraceError: the gzip stream is truncated or damaged.
    :raises HostileTraceError: the decompressed size exceeds ``max_bytes``.
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
                raise HostileTraceError(
                    f"{path}: decompresses to more than {limit} bytes (the cap); raise "
                    "CPTRACE_MAX_DECOMPRESSED_BYTES if this trace is genuine"
                )
            out.write(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise CorruptTraceError(
            f"{path}: gzip stream is truncated or damaged after {written} bytes ({exc})"
        ) from exc
