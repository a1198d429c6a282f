"""Stream an upload's file straight into a temp file: a multipart form field or a raw body.

Starlette's form parser spools the whole body before the route sees it; here the size limit is
enforced while bytes arrive, the file is hashed on the way (the hash is the idempotency key),
and small text fields are kept in memory up to a few KiB each.

Two body forms, one result (``receive_upload``): ``multipart/form-data`` with the file in one
field (browsers, ``curl -F``, older clients), or the file itself as the body with a
``Content-Type`` from ``RAW_TYPES`` (``cptrace upload`` and the runners: no multipart framing
to write or parse).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from service.core.errors import BadRequest, PayloadTooLarge
from service.storage.blobs import Blobs, aiter_limited

MAX_TEXT_FIELD = 64 * 1024
MAX_BOUNDARY = 256  # RFC 2046 allows 70; python-multipart accepts up to 256


@dataclass
class ReceivedFile:
    """The file part of an upload, complete in a temp file (the caller removes it)."""

    path: Path
    sha256: str
    size: int
    filename: str
    fields: dict[str, str] = field(default_factory=dict)


class _Collector:
    def __init__(self, blobs: Blobs, file_field: str) -> None:
        self.blobs = blobs
        self.file_field = file_field
        self.header_field = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}
        self.current: str | None = None
        self.out: IO[bytes] | None = None
        self.path: Path | None = None
        self.digest = hashlib.sha256()
        self.size = 0
        self.filename = ""
        self.text: bytearray | None = None
        self.fields: dict[str, str] = {}

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": lambda d, s, e: setattr(
                self, "header_field", self.header_field + d[s:e]
            ),
            "on_header_value": lambda d, s, e: setattr(
                self, "header_value", self.header_value + d[s:e]
            ),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
        }

    def part_begin(self) -> None:
        self.headers, self.current, self.text = {}, None, None

    def header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field, self.header_value = b"", b""

    def headers_finished(self) -> None:
        _, params = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        self.current = name
        if name == self.file_field:
            if self.out is not None:
                raise BadRequest(f"the form holds more than one '{self.file_field}' field")
            self.filename = params.get(b"filename", b"").decode("utf-8", "replace")
            self.out, self.path = self.blobs.open_temp()
        else:
            self.text = bytearray()

    def part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.current == self.file_field and self.out is not None:
            self.digest.update(chunk)
            self.size += len(chunk)
            self.out.write(chunk)
        elif self.text is not None:
            self.text += chunk
            if len(self.text) > MAX_TEXT_FIELD:
                raise PayloadTooLarge(
                    f"form field '{self.current}' is longer than {MAX_TEXT_FIELD} bytes"
                )

    def part_end(self) -> None:
        if self.current and self.current != self.file_field and self.text is not None:
            self.fields[self.current] = self.text.decode("utf-8", "replace")

    def discard(self) -> None:
        if self.out is not None:
            self.out.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


RAW_TYPES = frozenset(
    (b"application/gzip", b"application/x-gzip", b"application/x-tar", b"application/octet-stream")
)
"""Content types of a raw-body upload (the body is the file; its content is sniffed, not this)."""


async def receive_upload(
    request: Request, *, field: str, blobs: Blobs, limit: int, raw: bool = False
) -> ReceivedFile:
    """The uploaded file in a temp file, from a multipart form (file field ``field``) or, where
    ``raw`` allows it, a raw body (``RAW_TYPES``); 400/413 on bad input or another body type."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if raw and ctype in RAW_TYPES:
        return await _receive_raw(request, blobs=blobs, limit=limit)
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        types = " or ".join(t.decode() for t in sorted(RAW_TYPES))
        alternative = f", or the file itself as the body (Content-Type: {types})" if raw else ""
        raise BadRequest(
            f"expected a multipart/form-data body with a file field '{field}'{alternative}"
        )
    return await _receive_form(request, params[b"boundary"], field=field, blobs=blobs, limit=limit)


def _refuse_declared_size(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body ({declared} bytes) is larger than the limit of {limit} bytes"
        )


async def _receive_raw(request: Request, *, blobs: Blobs, limit: int) -> ReceivedFile:
    """The whole body is the file: into a temp file, hashed on the way."""
    _refuse_declared_size(request, limit)
    out, path = blobs.open_temp()
    digest = hashlib.sha256()
    size = 0
    try:
        with out:
            async for chunk in aiter_limited(request.stream(), limit):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if size == 0:
        path.unlink(missing_ok=True)
        raise BadRequest("the request body is empty (expected the file)")
    return ReceivedFile(path, digest.hexdigest(), size, "")


async def _receive_form(
    request: Request, boundary: bytes, *, field: str, blobs: Blobs, limit: int
) -> ReceivedFile:
    """Parse a multipart body, stream the ``field`` file part into a temp file."""
    if not 1 <= len(boundary) <= MAX_BOUNDARY:
        # checked before anything is written: a refused body leaves no temp file behind
        raise BadRequest(
            f"multipart boundary must be 1 to {MAX_BOUNDARY} characters (got {len(boundary)})"
        )
    _refuse_declared_size(request, limit)
    collector = _Collector(blobs, field)
    try:
        parser = MultipartParser(boundary, collector.callbacks())  # type: ignore[arg-type]
        async for chunk in aiter_limited(request.stream(), limit):
            parser.write(chunk)
        parser.finalize()
        if collector.out is None or collector.path is None:
            raise BadRequest(f"the form has no file field '{field}'")
        collector.out.close()
    except BaseException as exc:
        collector.discard()
        if isinstance(exc, ValueError) and not isinstance(exc, BadRequest):
            raise BadRequest(f"malformed multipart body ({exc})") from exc
        raise
    if collector.size == 0:
        collector.discard()
        raise BadRequest(f"the file field '{field}' is empty")
    return ReceivedFile(
        collector.path,
        collector.digest.hexdigest(),
        collector.size,
        collector.filename,
        collector.fields,
    )
