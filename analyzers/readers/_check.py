"""The upload check of a trace: structural, streaming, bounded (never a whole-file parse).

``check_trace`` (public in ``analyzers.readers``) answers "is this worth storing and queueing for
analysis?" in milliseconds, so an upload hears about a wrong file at once while the one full read
happens later, in the analysis worker:

- JSON: the text is tokenized from the start with strict JSON grammar (no NaN/Infinity, nesting
  at most ``MAX_DEPTH``) until the ``traceEvents`` list has shown ``CHECK_EVENTS`` events, all
  objects, or the text ends. A file that ends inside the scan is checked completely.
- SQLite: the readers' own guard (no triggers, views, virtual tables, generated columns) and the
  tables an nsys export must have.

Memory stays at the scanned prefix (``MAX_PREFIX_BYTES``) however far the file expands.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from analyzers.errors import CorruptTraceError, TraceTooLargeError, UnsupportedTraceError
from analyzers.readers._sqlite_guard import inspect_schema, open_readonly
from analyzers.readers.nsys import EVENT_TABLES, READ_TABLES, SIGNATURE_TABLES

MAX_DEPTH = 200
"""Deepest JSON nesting accepted in a trace (Kineto events nest 3-4 levels)."""
CHECK_EVENTS = 20
"""Events of ``traceEvents`` whose shape the upload check confirms."""
MAX_PREFIX_BYTES = 8 << 20
"""Decompressed bytes the check may read before it must have seen the first event."""
_READ = 64 << 10

_TOKEN = re.compile(
    r'"[^"\\\x00-\x1f]*+(?:\\.[^"\\\x00-\x1f]*+)*+"'  # a string (possessive: no backtracking)
    r'|(?P<cut>"[^"\\\x00-\x1f]*+(?:\\.[^"\\\x00-\x1f]*+)*+(?P<esc>\\?)\Z)'  # cut by the end
    r'|[\[\]{},:]|[^\s\[\]{},:"]+|\S'
)
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_LITERALS = frozenset(("true", "false", "null"))


class _Invalid(Exception):
    """Internal: the text breaks the grammar (turned into ``CorruptTraceError``)."""


def _texts(stream: IO[bytes], label: str) -> Iterator[str]:
    """UTF-8 text chunks of ``stream``, the BOM dropped, at most ``MAX_PREFIX_BYTES`` bytes
    unless the caller stops earlier."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    read = 0
    while True:
        data = stream.read(_READ)
        read += len(data)
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise CorruptTraceError(f"{label}: invalid JSON trace: not UTF-8 text ({exc})") from exc
        if text:
            yield text
        if not data:
            return
        if read > MAX_PREFIX_BYTES:
            raise TraceTooLargeError(
                f"{label}: the first {MAX_PREFIX_BYTES} bytes (the limit of the upload check) "
                "do not show a trace's structure (traceEvents and its first events)"
            )


_STRING_REST = re.compile(r'[^"\\\x00-\x1f]*+(?:\\.[^"\\\x00-\x1f]*+)*+(\\?)')
"""The rest of a string cut by a chunk boundary: its characters up to the closing quote (or the
chunk's end; group 1 is a trailing backslash whose escaped character is in the next chunk)."""
MAX_BARE_TOKEN = 4096
"""Longest number or literal accepted (a longer run of bare characters is no JSON value)."""


def _tokens(texts: Iterator[str]) -> Iterator[str]:
    """JSON tokens across chunk boundaries, linear in the text.

    A short token cut by a boundary (a number, a literal) is re-read whole with the next chunk;
    a string cut by one is continued where it stopped (its parts kept, never re-scanned), so a
    string of many chunks costs one pass, not one pass per chunk.
    """
    carry = ""
    parts: list[str] = []  # an open string's text so far (from its quote)
    escaped = False  # that text ends inside an escape (its escaped character comes next)
    for text in texts:
        start = 0
        if parts:
            if escaped:
                parts.append(text[:1])
                start = 1
            rest = _STRING_REST.match(text, start)
            assert rest is not None  # the pattern matches the empty string
            stop = rest.end()
            if stop == len(text):
                parts.append(text[start:])
                escaped = bool(rest.group(1))
                continue
            if text[stop] != '"':
                raise _Invalid("a control character inside a string")
            yield "".join([*parts, text[start : stop + 1]])
            parts, escaped = [], False
            start = stop + 1
        buf = carry + text[start:]
        carry = ""  # whitespace between tokens is never carried
        for match in _TOKEN.finditer(buf):
            if match.end() == len(buf):  # may continue in the next chunk
                if match.lastgroup == "cut":
                    parts, escaped = [match.group()], bool(match.group("esc"))
                else:
                    carry = match.group()
                break
            yield match.group()
        if len(carry) > MAX_BARE_TOKEN:
            raise _Invalid(f"a bare token longer than {MAX_BARE_TOKEN} characters")
    if parts:
        yield "".join(parts)  # an unterminated string: the grammar reports the early end
    for match in _TOKEN.finditer(carry):
        yield match.group()


class _Scan:
    """A strict JSON grammar over tokens that reports where ``traceEvents`` items start."""

    def __init__(self, tokens: Iterator[str]) -> None:
        self.tokens = tokens
        self.path: list[str] = []  # container chars ("{" / "[") from the top
        self.events = 0

    def next(self) -> str:
        token = next(self.tokens, None)
        if token is None:
            raise _Invalid("the text ends early (truncated?)")
        return token

    def value(self, token: str) -> None:
        """Consume the value starting at ``token`` (nested containers iteratively bounded)."""
        if token == "{":
            self.container("{", "}")
        elif token == "[":
            self.container("[", "]")
        elif token.startswith('"'):
            return
        elif token not in _LITERALS and not _NUMBER.match(token):
            raise _Invalid(f"unexpected {token[:20]!r} (NaN and Infinity are not JSON)")

    def container(self, open_: str, close: str) -> None:
        self.path.append(open_)
        if len(self.path) > MAX_DEPTH:
            raise _Invalid(f"nested deeper than {MAX_DEPTH} levels")
        token = self.next()
        if token != close:
            while True:
                if open_ == "{":
                    if not token.startswith('"'):
                        raise _Invalid(f"expected a key string, got {token[:20]!r}")
                    if self.next() != ":":
                        raise _Invalid("expected ':' after a key")
                    token = self.next()
                self.value(token)
                token = self.next()
                if token == close:
                    break
                if token != ",":
                    raise _Invalid(f"expected ',' or {close!r}, got {token[:20]!r}")
                token = self.next()
        self.path.pop()


def check_json_trace(stream: IO[bytes], *, label: str) -> None:
    """Check the structure of trace JSON read from ``stream`` (see the module docstring).

    :raises CorruptTraceError: invalid JSON, or no ``traceEvents`` list of objects.
    :raises TraceTooLargeError: no event within ``MAX_PREFIX_BYTES``.
    """
    scan = _Scan(_tokens(_texts(stream, label)))
    try:
        _check_top(scan, label)
    except _Invalid as exc:
        raise CorruptTraceError(f"{label}: invalid JSON trace: {exc}") from None


def _check_top(scan: _Scan, label: str) -> None:
    token = scan.next()
    if token == "[":  # Chrome's "JSON Array Format": a bare event list
        _check_events(scan, label, "the top-level array")
        return
    if token != "{":
        raise _Invalid(f"expected an object with traceEvents, got {token[:20]!r}")
    scan.path.append("{")
    token = scan.next()
    seen_events = False
    while token != "}":
        if not token.startswith('"'):
            raise _Invalid(f"expected a key string, got {token[:20]!r}")
        if scan.next() != ":":
            raise _Invalid("expected ':' after a key")
        if token == '"traceEvents"':
            if scan.next() != "[":
                raise _Invalid("traceEvents is not a list (expected a list of event objects)")
            if _check_events(scan, label, "traceEvents"):
                return  # enough events confirmed: the rest is the analysis' full read
            seen_events = True
        else:
            scan.value(scan.next())
        token = scan.next()
        if token == ",":
            token = scan.next()
        elif token != "}":
            raise _Invalid(f"expected ',' or '}}', got {token[:20]!r}")
    if not seen_events:
        raise _Invalid("no traceEvents list (expected a PyTorch profiler / Chrome trace)")
    _end(scan)


def _check_events(scan: _Scan, label: str, where: str) -> bool:
    """Check list items are objects; True once ``CHECK_EVENTS`` were (the scan stops there)."""
    scan.path.append("[")
    token = scan.next()
    index = 0
    while token != "]":
        if token != "{":
            raise _Invalid(f"{where}[{index}] is {token[:20]!r}, expected an event object")
        scan.value(token)
        index += 1
        if index >= CHECK_EVENTS:
            return True
        token = scan.next()
        if token == ",":
            token = scan.next()
        elif token != "]":
            raise _Invalid(f"expected ',' or ']' in {where}, got {token[:20]!r}")
    scan.path.pop()
    if where != "traceEvents":
        _end(scan)
    return False


def _end(scan: _Scan) -> None:
    extra = next(scan.tokens, None)
    if extra is not None:
        raise _Invalid(f"unexpected {extra[:20]!r} after the end of the JSON value")


def sqlite_tables_ok(path: Path, *, label: str) -> None:
    """The nsys upload check: the readers' schema guard plus the tables an export needs."""
    try:
        conn = open_readonly(path)
        try:
            schema = inspect_schema(conn, Path(label), READ_TABLES)
        finally:
            conn.close()
    except (CorruptTraceError, UnsupportedTraceError) as exc:  # name the upload, not our copy
        message = str(exc).replace(str(path.resolve()), label).replace(str(path), label)
        raise type(exc)(message) from exc

    if not all(schema.has(t) for t in SIGNATURE_TABLES):
        raise UnsupportedTraceError(
            f"{label}: SQLite file is not an Nsight Systems export (no StringIds table; expected "
            f"tables such as {', '.join(EVENT_TABLES[:3])})"
        )
    if not any(schema.has(t) for t in EVENT_TABLES):
        raise CorruptTraceError(
            f"{label}: nsys export has no events (none of {', '.join(EVENT_TABLES)})"
        )
