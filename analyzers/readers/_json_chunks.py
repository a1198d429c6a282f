"""Any-layout path of the Kineto reader: whole events cut out per chunk, parsed by ``orjson``.

Why: a trace that another tool re-serialized (``json.dump(obj, indent=1)``, compact separators,
keys in another order) is not in Kineto's line layout, so the vectorized reader
(``_kineto_layout``) cannot cut its fields out. Reading it one event at a time with the standard
library scanner costs several times the fast path; parsing the whole file with ``orjson`` costs
a Python object per event for the whole file at once (about ten times the file in memory).
This path finds the event boundaries of about a megabyte of text at a time with a few numpy
passes (quotes, backslashes, brackets; depth counted outside strings), hands the whole events
of that chunk to ``orjson`` in one call, and keeps memory at one chunk of parsed events.

Most events are never parsed as JSON: the keys at each event's own level (not inside its
``args``) are found from the string delimiters, and a range event (``python_function``,
``cpu_op``, ``user_annotation``: most of a trace) whose ``ph``, ``cat``, ``name``, ``pid``,
``tid``, ``ts`` and ``dur`` read cleanly becomes a row without a Python object, like in the
layout reader; every other event is parsed by ``orjson``, in one call per chunk, and both go
through the layout reader's ``_emit`` (rows in file order, names interned in order of
appearance). Times stay exact: ``ts`` / ``dur`` are cut out of the text and converted to
integer ns with integer arithmetic, also for the events parsed as JSON (``ExactNs``).

Anything unexpected (malformed JSON, no ``traceEvents``, an event larger than
``MAX_EVENT_BYTES``) raises ``ChunkMismatch``; the caller then reads the file with the streaming
scanner (``_json_stream``), which names the exact position of a syntax error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import orjson

from analyzers.readers._kineto_layout import (
    FAST_CATS,
    RowSink,
    _Bytes,
    _emit,
    _fits_ns,
    _ns,
    _numbers,
)

CHUNK_BYTES = 1 << 20
"""Text parsed per ``orjson`` call (whole events only)."""
MAX_HEADER_BYTES = 64 << 20
"""Text before ``traceEvents`` larger than this: refused to this path."""
MAX_EVENT_BYTES = 64 << 20
"""One event larger than this: refused to this path (bounds memory on odd input)."""
_WHITESPACE = b" \t\r\n"


class ChunkMismatch(Exception):
    """The text is not a JSON trace this path can read: use the streaming scanner."""


class _Structure:
    """Where the brackets outside strings are, and the nesting depth after each.

    The text must start outside any string. A quote is a string delimiter unless an odd run of
    backslashes precedes it; a bracket between an odd and an even delimiter is inside a string.
    """

    __slots__ = ("close_depth", "depth", "position", "quotes")

    def __init__(self, text: bytes) -> None:
        arr = np.frombuffer(text, dtype=np.uint8)
        quotes = np.flatnonzero(arr == 34)
        if len(quotes) and (arr == 92).any():
            quotes = quotes[~_escaped(arr, quotes)]
        self.quotes = quotes
        brackets = np.flatnonzero((arr == 123) | (arr == 125) | (arr == 91) | (arr == 93))
        outside = np.searchsorted(quotes, brackets) % 2 == 0
        self.position = brackets[outside]
        opening = (arr[self.position] == 123) | (arr[self.position] == 91)
        step = np.where(opening, 1, -1)
        self.depth = np.cumsum(step)
        """Depth after each bracket; the text's own level is 0."""
        self.close_depth = np.where(opening, 99, self.depth)
        """Depth after each closing bracket (99 for opening ones)."""

    def depth_at(self, where: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Nesting depth at text positions (0: between the events)."""
        before = np.searchsorted(self.position, where) - 1
        out: npt.NDArray[np.int64] = np.where(before >= 0, self.depth[np.maximum(before, 0)], 0)
        return out

    def in_string(self, where: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """True where a position lies inside a string (or is its closing quote)."""
        out: npt.NDArray[np.bool_] = np.searchsorted(self.quotes, where) % 2 == 1
        return out


def _escaped(arr: npt.NDArray[np.uint8], quotes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Quotes preceded by an odd number of backslashes."""
    backslash = arr == 92
    index = np.arange(len(arr), dtype=np.int64)
    last_other = np.maximum.accumulate(np.where(backslash, -1, index))
    before = np.maximum(quotes - 1, 0)
    run = np.where((quotes > 0) & backslash[before], before - last_other[before], 0)
    out: npt.NDArray[np.bool_] = run % 2 == 1
    return out


def read_chunks(blocks: Iterator[bytes], header: dict[str, object], sink: RowSink) -> None:
    """Parse a JSON trace of any layout from its text blocks; fill ``header`` and the sink.

    :raises ChunkMismatch: not valid JSON of a trace (the caller starts over with the scanner).
    """
    buf, events_at = _find_events(blocks, header)
    buf = buf[events_at:]
    done = False
    while True:
        while not done and len(buf) < CHUNK_BYTES:
            block = next(blocks, b"")
            done = not block
            buf += block
        structure = _Structure(buf)
        ends = np.flatnonzero(structure.close_depth <= 0)
        closing = np.flatnonzero(structure.close_depth[ends] < 0)
        if len(closing):  # the "]" of traceEvents: the last events, then the trailer
            array_end = int(structure.position[ends[closing[0]]])
            _events(buf[:array_end], structure, sink)
            _tail(buf[array_end + 1 :], header)
            if any(block.strip(_WHITESPACE) for block in blocks):
                raise ChunkMismatch("text after the end of the JSON document")
            return
        if done:
            raise ChunkMismatch("the traceEvents array does not end")
        if not len(ends):
            if len(buf) > MAX_EVENT_BYTES:
                raise ChunkMismatch("an event larger than the chunk limit")
            block = next(blocks, b"")
            done = not block
            buf += block
            continue
        cut = int(structure.position[ends[-1]]) + 1
        _events(buf[:cut], structure, sink)
        buf = buf[cut:]


def _find_events(blocks: Iterator[bytes], header: dict[str, object]) -> tuple[bytes, int]:
    """Read until the ``traceEvents`` array opens; returns the text so far and the offset just
    after its ``[``. The keys before it go into ``header``."""
    buf = b""
    for block in blocks:
        buf += block
        start = buf.lstrip(_WHITESPACE)
        if start[:1] == b"[":  # Chrome's "JSON Array Format": a bare event list
            header["traceEvents"] = "top-level array"
            return buf, len(buf) - len(start) + 1
        found = _events_key(buf)
        if found is not None:
            key_at, open_at = found
            prefix = buf[:key_at].rstrip(_WHITESPACE)
            header.update(_object(prefix.rstrip(b",") + b"}"))
            return buf, open_at + 1
        if len(buf) > MAX_HEADER_BYTES:
            break
    raise ChunkMismatch("no traceEvents array")


_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')


def _events_key(buf: bytes) -> tuple[int, int] | None:
    """(offset of the key, offset of its ``[``) for a ``traceEvents`` key of the top object."""
    matches = list(_EVENTS_KEY.finditer(buf))
    if not matches:
        return None
    structure = _Structure(buf)
    for match in matches:
        at = np.array([match.start()], dtype=np.int64)
        if not structure.in_string(at)[0] and structure.depth_at(at)[0] == 1:
            return match.start(), match.end() - 1
    return None


def _object(text: bytes) -> dict[str, object]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ChunkMismatch(f"the top-level object is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ChunkMismatch("the trace is not a JSON object")
    return value


def _tail(text: bytes, header: dict[str, object]) -> None:
    """Top-level keys after the events (Kineto writes ``traceName`` there)."""
    rest = text.strip(_WHITESPACE)
    if header.get("traceEvents") == "top-level array":
        if rest:
            raise ChunkMismatch("text after the top-level array")
        return
    if rest == b"}":
        return
    if not rest.startswith(b","):
        raise ChunkMismatch("unexpected text after the traceEvents array")
    header.update(_object(b"{" + rest[1:]))


_KEYS = {b"ph": 0, b"cat": 1, b"name": 2, b"pid": 3, b"tid": 4, b"ts": 5, b"dur": 6}
"""Top-level keys of a range event that this path reads without a JSON parser."""


def _events(text: bytes, structure: _Structure, sink: RowSink) -> None:
    """The whole events of ``text`` (``{...}, {...}``): range events (Python frames, ops,
    annotations: most of a trace) cut out vectorized, every other event parsed by ``orjson``;
    all in file order through the layout reader's ``_emit``."""
    within = structure.position < len(text)  # the structure may cover text after the cut
    is_open = structure.close_depth == 99
    opens = structure.position[within & (structure.depth == 1) & is_open]
    closes = structure.position[within & (structure.depth == 0) & ~is_open]
    if not len(opens):
        if text.strip(_WHITESPACE).strip(b",").strip(_WHITESPACE):
            raise ChunkMismatch("traceEvents holds something other than objects")
        return
    if len(opens) != len(closes) or (np.frombuffer(text, dtype=np.uint8)[opens] != 123).any():
        raise ChunkMismatch("traceEvents holds something other than objects")
    data = _Bytes(text)
    fields = _fields(data, structure, opens, closes)
    kind, name_span, pid, tid, start, end, fast_ok, ts_ok, skip = fields
    fast = np.flatnonzero(fast_ok)
    slow = np.flatnonzero(~fast_ok & ~skip)
    names = [
        text[a:b]
        for a, b in zip(name_span[0][fast].tolist(), name_span[1][fast].tolist(), strict=True)
    ]
    times = (start[slow], end[slow] - start[slow], ts_ok[slow])
    _emit(
        text,
        opens - 2,  # _emit reads an event as text[open + 2 : close + 3]
        closes - 2,
        fast,
        kind[fast],
        (pid[fast], tid[fast], start[fast], end[fast], np.zeros(len(fast), dtype=np.int64)),
        names,
        slow,
        times,
        sink,
    )


def _fields(
    data: _Bytes,
    structure: _Structure,
    opens: npt.NDArray[np.int64],
    closes: npt.NDArray[np.int64],
) -> tuple[
    npt.NDArray[np.int64],
    tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.bool_],
    npt.NDArray[np.bool_],
]:
    """Per event: range kind, name span, pid, tid, start/end ns, whether all of it was read
    (a range event, every field once, integers and plain numbers), whether the times were
    (for the events parsed as JSON), and whether the event is no row at all (a flow)."""
    arr = data.arr
    count = len(opens)
    quotes = structure.quotes[structure.quotes < data.size]  # the structure may run past the cut
    starts, stops = quotes[0::2], quotes[1::2]
    starts = starts[: len(stops)]
    # Candidate keys: strings of a key's length starting like one ("ph", "cat", ...), then
    # those followed by ":" at the events' own level.
    length = stops - starts - 1
    which = np.full(len(starts), -1, dtype=np.int64)
    for size in sorted({len(key) for key in _KEYS}):
        sized = np.flatnonzero(length == size)
        for key, code in _KEYS.items():
            if len(key) == size:
                which[sized[data.has(starts[sized] + 1, key)]] = code
    key_rows = np.flatnonzero(which >= 0)
    after = _skip_spaces(arr, stops[key_rows] + 1)
    mine = arr[after] == 58
    key_rows, after = key_rows[mine], after[mine]
    mine = structure.depth_at(starts[key_rows]) == 1
    key_rows, after = key_rows[mine], after[mine]
    if not len(key_rows):  # no keys at the events' level: every event goes the JSON way
        none = np.zeros(count, dtype=np.int64)
        return none, (none, none), none, none, none, none, none < 0, none < 0, none < 0
    key_start = starts[key_rows]
    which = which[key_rows]
    event = np.searchsorted(opens, key_start) - 1
    value = _skip_spaces(arr, after + 1)
    # string values: the value is the next string
    next_string = np.minimum(key_rows + 1, len(starts) - 1)
    is_string = starts[next_string] == value
    value_end = np.where(is_string, stops[next_string], -1)
    # numbers (pid, tid, ts, dur only): up to the first character that is neither a digit
    # nor a dot, within the width ``_numbers`` reads (longer ones go the JSON way)
    mantissa = np.zeros(len(key_rows), dtype=np.int64)
    fraction = np.zeros(len(key_rows), dtype=np.int64)
    number_ok = np.zeros(len(key_rows), dtype=bool)
    numeric = np.flatnonzero(which >= 3)
    window = data.columns(value[numeric])
    digits = (window - np.uint8(48) < 10) | (window == 46)
    width = np.argmin(digits, axis=1)  # first non-number column (0 if none: too long)
    number_end = value[numeric] + width
    m, f, number_start, good = _numbers(data, number_end)
    good &= (width > 0) & (number_start == value[numeric]) & (digits[:, 0])
    good &= arr[value[numeric]] != 46
    mantissa[numeric], fraction[numeric], number_ok[numeric] = m, f, good
    seen = np.zeros((len(_KEYS), count), dtype=np.int64)
    np.add.at(seen, (np.maximum(which, 0)[which >= 0], event[which >= 0]), 1)
    ok = (seen == 1).all(axis=0)
    per_event = np.full((len(_KEYS), count), -1, dtype=np.int64)
    per_event[which[which >= 0], event[which >= 0]] = np.flatnonzero(which >= 0)

    def field(code: int) -> npt.NDArray[np.int64]:
        rows: npt.NDArray[np.int64] = np.maximum(per_event[code], 0)
        return rows

    ph, cat, name, pid_k, tid_k, ts_k, dur_k = (field(c) for c in range(len(_KEYS)))
    one_letter = (per_event[0] >= 0) & is_string[ph] & (value_end[ph] - value[ph] == 2)
    phase = arr[value[ph] + 1]
    ok &= one_letter & (phase == 88)  # "X"
    # Flows ("s"/"f"), instants ("i") and the like: not rows, and not metadata.
    skip = one_letter & (phase != 88) & (phase != 77)
    kind = np.full(count, -1, dtype=np.int64)
    cat_len = value_end[cat] - value[cat] - 1
    for cat_name, cat_kind in FAST_CATS.items():
        hit = is_string[cat] & (cat_len == len(cat_name)) & data.has(value[cat] + 1, cat_name)
        kind[hit] = cat_kind
    ok &= kind >= 0
    ok &= is_string[name]
    for k in (pid_k, tid_k):
        ok &= number_ok[k] & (fraction[k] == 0)
    times_ok = (per_event[5] >= 0) & (per_event[6] >= 0)
    for k in (ts_k, dur_k):
        times_ok &= number_ok[k] & _fits_ns(mantissa[k], fraction[k])
    ok &= times_ok
    start = np.where(times_ok, _ns(mantissa[ts_k], fraction[ts_k]), 0)
    end = start + np.where(times_ok, _ns(mantissa[dur_k], fraction[dur_k]), 0)
    name_span = (value[name] + 1, value_end[name])
    return kind, name_span, mantissa[pid_k], mantissa[tid_k], start, end, ok, times_ok, skip


def _skip_spaces(arr: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Advance each position past JSON whitespace (a few characters at most in practice)."""
    at = at.copy()
    for _ in range(64):
        space = (arr[at] == 32) | (arr[at] == 10) | (arr[at] == 13) | (arr[at] == 9)
        if not space.any():
            break
        at[space] += 1
    return at
