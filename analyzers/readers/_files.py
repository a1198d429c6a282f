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
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from isal import isal_zlib

from analyzers.errors import CorruptTraceError, TraceTooLargeError, UnsupportedTraceError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"

DEFAULT_MAX_DECOMPRESSED = 64 << 30
"""Largest decompressed trace accepted when the caller gives no cap (64 GiB): the CLI on local
files. The service passes its own (``Settings.max_decompressed_bytes``)."""


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


def read_head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    """First ``size`` bytes of the file, decompressed when it is gzip (``inflated``)."""
    head = b""
    for block in file_blocks(path, DEFAULT_MAX_DECOMPRESSED):
        head += block
        if len(head) >= size:
            break
    return head[:size]


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


READ_BYTES = 256 << 10
"""Compressed bytes read per system call."""
BLOCK_BYTES = 1 << 20
"""Most decompressed bytes one inflate step produces (bounds memory per block)."""

_INFLATE_ERROR: type[Exception] = isal_zlib.error  # type: ignore[assignment]
"""ISA-L's damaged-stream error (its stub declares an instance, not the class)."""


def inflated(raw: IO[bytes], cap: int, *, label: str) -> Iterator[bytes]:
    """The one capped inflate: gzip data from ``raw`` as decompressed blocks.

    One rule for every reader of gzip (the upload check, the bundle reader, the Kineto and nsys
    readers): concatenated gzip members are one stream; NUL bytes after a member (padding) are
    ignored; anything else after a member must be the next member. The inflater is ISA-L's
    (``isal.isal_zlib``, the same API as ``zlib``): about 2.5x faster than zlib's on trace text.

    :raises CorruptTraceError: damaged or truncated data, or bytes after a member that are
        neither NUL padding nor another gzip member.
    :raises TraceTooLargeError: the data expands past ``cap`` bytes.
    """
    produced = 0
    inflater = None  # between members (or before the first)
    started = False
    data = b""
    while True:
        if not data:
            data = raw.read(READ_BYTES)
            if not data:
                break
        if inflater is None:
            if started:
                data = data.lstrip(b"\x00")  # padding after a member
                if not data:
                    continue
            if len(data) < len(GZIP_MAGIC) and (more := raw.read(READ_BYTES)):
                data += more
                continue
            if not data.startswith(GZIP_MAGIC):
                raise _trailing(label) if started else CorruptTraceError(f"{label}: not gzip data")
            inflater = isal_zlib.decompressobj(16 + isal_zlib.MAX_WBITS)
            started = True
        while True:
            try:
                out = inflater.decompress(data, BLOCK_BYTES)
            except _INFLATE_ERROR as exc:
                raise CorruptTraceError(
                    f"{label}: not valid gzip data (damaged after {produced} bytes: {exc})"
                ) from exc
            produced += len(out)
            if produced > cap:
                raise TraceTooLargeError(
                    f"{label}: decompresses to more than the limit of {cap} bytes (the cap)"
                )
            if out:
                yield out
            if inflater.eof:
                data, inflater = inflater.unused_data, None
                break
            data = inflater.unconsumed_tail
            if not data and len(out) < BLOCK_BYTES:
                break  # all input taken, no output held back: read on
    if inflater is not None:
        raise CorruptTraceError(
            f"{label}: gzip data is truncated (ended after {produced} bytes, inside a member)"
        )


def _trailing(label: str) -> CorruptTraceError:
    return CorruptTraceError(
        f"{label}: bytes after the gzip data that are neither NUL padding nor another gzip member"
    )


def file_blocks(path: Path, cap: int) -> Iterator[bytes]:
    """The file's bytes in blocks, gunzipped by content (``inflated``) under ``cap``."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        if gzipped:
            yield from inflated(raw, cap, label=str(path))
            return
        while data := raw.read(READ_BYTES):
            yield data


class CappedGunzip:
    """A read-only stream over gzip data (``inflated``: its rules, its cap).

    Used where a file object is wanted: the outer gzip of a bundle (``tarfile``) and the
    upload check of gzipped traces.
    """

    def __init__(self, raw: IO[bytes], cap: int, *, label: str) -> None:
        self._raw = raw
        self._blocks = inflated(raw, cap, label=label)
        self._buffer = bytearray()
        self._produced = 0

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
            chunks = [bytes(self._buffer)]
            self._buffer.clear()
            for block in self._blocks:
                self._produced += len(block)
                chunks.append(block)
            return b"".join(chunks)
        while len(self._buffer) < size:
            more = next(self._blocks, None)
            if more is None:
                break
            self._produced += len(more)
            self._buffer += more
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def drain(self) -> None:
        """Inflate the rest, discarding it: the whole stream is checked against the rules."""
        self._buffer.clear()
        for block in self._blocks:
            self._produced += len(block)


def open_maybe_gzip(raw: IO[bytes], cap: int, *, label: str) -> tuple[IO[bytes], bool]:
    """``raw`` itself, or a ``CappedGunzip`` over it when it starts with the gzip magic; and
    whether it was gzip. ``raw`` must be seekable (a file)."""
    gzipped = raw.read(2) == GZIP_MAGIC
    raw.seek(0)
    if gzipped:
        return CappedGunzip(raw, cap, label=label), True  # type: ignore[return-value]
    return raw, False


@contextlib.contextmanager
def decompressed_copy(path: Path, max_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> Iterator[Path]:
    """Decompress a gzip file (``inflated``) into a private temporary file, removed on exit.

    SQLite needs a real file to open, so a ``.sqlite.gz`` export cannot be streamed.

    :raises CorruptTraceError: the gzip data is truncated or damaged.
    :raises TraceTooLargeError: the decompressed size exceeds ``max_bytes``.
    """
    fd, name = tempfile.mkstemp(prefix="cptrace-", suffix=".sqlite")
    target = Path(name)
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
            for block in inflated(src, max_bytes, label=str(path)):
                out.write(block)
        yield target
    finally:
        target.unlink(missing_ok=True)
