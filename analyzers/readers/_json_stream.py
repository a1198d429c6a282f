"""Incremental reader for Chrome-trace JSON: yields ``traceEvents`` items one at a time.

Why not ``json.load``: a Kineto trace of a long run is several GB of text; loading it makes a
Python dict per event (~10x the file size in RAM). Why not ``ijson``: the C scanner of the
standard library (``JSONDecoder.raw_decode``) decodes one event at C speed, so a small scanner
that only walks the top-level object and the ``traceEvents`` array needs no dependency and
keeps memory at one text chunk plus one event.

The top-level keys other than ``traceEvents`` (``distributedInfo``, ``deviceProperties``, ...)
are decoded whole into ``header``; Kineto writes most before the events and a few (``traceName``)
after, so ``header`` is complete only once the iterator is exhausted. A top-level array (the
Chrome "JSON Array Format") is accepted as a bare event list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import TextIO

from analyzers.errors import CorruptTraceError, UnsupportedTraceError

CHUNK_CHARS = 1 << 20
MAX_VALUE_CHARS = 64 << 20
"""Largest single event or header value; bounds memory when the text is malformed."""
_SKIP_WHITESPACE = re.compile(r"[ \t\n\r]*").match


class _Buffer:
    """A sliding window over the text stream; ``pos`` indexes ``text``."""

    __slots__ = ("eof", "label", "offset", "pos", "stream", "text")

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.text = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front, for error positions
        self.eof = False

    def fill(self) -> bool:
        """Append the next chunk (dropping consumed text); False at end of input."""
        if self.eof:
            return False
        chunk = self.stream.read(CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        if self.pos > len(self.text) // 2:
            self.offset += self.pos
            self.text = self.text[self.pos :]
            self.pos = 0
        self.text += chunk
        return True

    def peek(self) -> str:
        """Next non-whitespace character ('' at end of input), without consuming it."""
        while True:
            skipped = _SKIP_WHITESPACE(self.text, self.pos)
            self.pos = skipped.end() if skipped else self.pos  # the pattern always matches
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.fill():
                return ""

    def expect(self, chars: str, what: str) -> str:
        """Consume one of ``chars`` (after whitespace) or fail naming ``what`` was expected."""
        found = self.peek()
        if not found or found not in chars:
            self.fail(f"expected {what}, found {found!r}" if found else f"ended before {what}")
        self.pos += 1
        return found

    def fail(self, problem: str) -> None:
        raise CorruptTraceError(
            f"{self.label}: truncated or malformed JSON at character {self.offset + self.pos}: "
            f"{problem}"
        )


_DECODER = json.JSONDecoder(parse_float=Decimal)
"""Numbers with a fraction stay exact decimals: times become integer ns without a float."""


def _value(buf: _Buffer) -> object:
    """Decode one JSON value at the cursor, reading more text until it is complete."""
    buf.peek()
    while True:
        try:
            value, end = _DECODER.raw_decode(buf.text, buf.pos)
        except json.JSONDecodeError as exc:
            if len(buf.text) - buf.pos < MAX_VALUE_CHARS and buf.fill():
                continue
            buf.fail(exc.msg)
            raise  # unreachable: fail() raises
        # A number that stops exactly at the end of the window may continue in the next chunk.
        if end == len(buf.text) and buf.fill():
            continue
        buf.pos = end
        return value


def iter_events(stream: TextIO, label: str, header: dict[str, object]) -> Iterator[object]:
    """Yield each item of ``traceEvents``; other top-level keys land in ``header``.

    :raises UnsupportedTraceError: the JSON is not an object with ``traceEvents`` (or an array).
    :raises CorruptTraceError: the text ends early or is not valid JSON.
    """
    buf = _Buffer(stream, label)
    opening = buf.expect("{[", "a JSON object or array")
    if opening == "[":
        header["traceEvents"] = "top-level array"
        yield from _array_items(buf)
        return
    seen_events = False
    if buf.peek() == "}":
        buf.pos += 1
    else:
        while True:
            key = _value(buf)
            if not isinstance(key, str):
                buf.fail("expected an object key")
            buf.expect(":", "':' after a key")
            if key == "traceEvents":
                seen_events = True
                buf.expect("[", "the traceEvents array")
                yield from _array_items(buf)
            else:
                header[str(key)] = _value(buf)
            if buf.expect(",}", "',' or '}'") == "}":
                break
    if not seen_events:
        raise UnsupportedTraceError(
            f"{label}: JSON is not a trace: no 'traceEvents' array (keys: "
            f"{', '.join(sorted(header)[:8]) or 'none'})"
        )


def _array_items(buf: _Buffer) -> Iterator[object]:
    if buf.peek() == "]":
        buf.pos += 1
        return
    while True:
        yield _value(buf)
        if buf.expect(",]", "',' or ']' in traceEvents") == "]":
            return
