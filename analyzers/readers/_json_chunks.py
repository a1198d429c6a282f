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
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from analyzers.readers._kineto_layout import (
    _POW10,
    _WIDTH,
    FAST_CATS,
    LAUNCH,
    LAUNCH_CATS,
    RowSink,
    _Bytes,
    _emit,
    _fits_ns,
    _ns,
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
    """Where the quotes, brackets and colons outside strings are, and the depth at each.

    The text must start outside any string. A quote is a string delimiter unless an odd run of
    backslashes precedes it; a bracket or colon between an odd and an even delimiter is inside a
    string. Brackets and colons are found in one pass, so the depth at every colon (whose key
    it ends: 1 for an event's own keys, 2 for those of its ``args``) comes with the brackets'.
    """

    __slots__ = (
        "close_depth",
        "colon_after",
        "colon_depth",
        "colon_event",
        "colons",
        "depth",
        "position",
        "quotes",
    )

    def __init__(self, text: bytes) -> None:
        arr = np.frombuffer(text, dtype=np.uint8)
        quotes = np.flatnonzero(arr == 34)
        if len(quotes) and (arr[np.maximum(quotes - 1, 0)] == 92).any():
            quotes = quotes[~_escaped(arr, quotes)]
        self.quotes = quotes
        folded = arr & np.uint8(0xDF)  # "{" -> "[", "}" -> "]"
        syntax = np.flatnonzero((folded == 91) | (folded == 93) | (arr == 58))
        after = np.searchsorted(quotes, syntax)
        outside = after % 2 == 0
        syntax, after = syntax[outside], after[outside]
        kinds = arr[syntax]
        colon = kinds == 58
        opening = (kinds == 123) | (kinds == 91)
        depth = np.cumsum(np.where(opening, 1, np.where(colon, 0, -1)))
        self.colons = syntax[colon]
        """Colons outside strings: one per key of every object."""
        self.colon_after = after[colon]
        """Index in ``quotes`` of the first quote after each colon (its key ends just before)."""
        self.colon_depth = depth[colon]
        """Depth at each colon (1: a key of an event itself)."""
        self.colon_event = np.cumsum(opening & (depth == 1))[colon] - 1
        """Index of the event (object at depth 1) of each colon, from the text's start."""
        self.position = syntax[~colon]
        opening = opening[~colon]
        self.depth = depth[~colon]
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


_ESCAPE_RUN = 64
"""Backslash runs before a quote longer than this are measured over the whole text."""


def _escaped(arr: npt.NDArray[np.uint8], quotes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Quotes preceded by an odd number of backslashes.

    Only quotes right after a backslash are looked at, walking back one byte at a time (runs
    are a byte or two in practice); a run longer than ``_ESCAPE_RUN`` is counted exactly over
    the whole text instead.
    """
    out = np.zeros(len(quotes), dtype=bool)
    candidates = np.flatnonzero((quotes > 0) & (arr[np.maximum(quotes - 1, 0)] == 92))
    run = np.ones(len(candidates), dtype=np.int64)
    active = np.arange(len(candidates))
    for _ in range(_ESCAPE_RUN):
        if not len(active):
            break
        before = quotes[candidates[active]] - run[active] - 1
        more = (before >= 0) & (arr[np.maximum(before, 0)] == 92)
        run[active[more]] += 1
        active = active[more]
    else:
        if len(active):
            return _escaped_everywhere(arr, quotes)
    out[candidates] = run % 2 == 1
    return out


def _escaped_everywhere(
    arr: npt.NDArray[np.uint8], quotes: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """``_escaped`` for any run length, over the whole text."""
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
        parts, size = [buf], len(buf)
        while not done and size < CHUNK_BYTES:  # joined once: no copy per block read
            block = next(blocks, b"")
            done = not block
            parts.append(block)
            size += len(block)
        buf = b"".join(parts)
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


_TOP_KEYS = (b"ph", b"cat", b"name", b"pid", b"tid", b"ts", b"dur", b"args")
"""Keys at an event's own level that this path reads without a JSON parser (codes 0-7)."""
_PH, _CAT, _NAME, _PID, _TID, _TS, _DUR, _ARGS, _CORRELATION = range(9)
"""Key codes; ``_CORRELATION`` is ``args.correlation`` (a launch's), one level down."""
_KEY_WORDS = [
    (
        code,
        np.uint64((1 << (8 * len(key) + 8)) - 1),
        np.uint64(int.from_bytes(key + b'"', "little")),
    )
    for code, key in enumerate(_TOP_KEYS)
]
"""(code, mask, word) of each key with its closing quote: one 8-byte compare per key."""


def _word_pattern(text: bytes) -> tuple[tuple[np.uint64, np.uint64], tuple[np.uint64, np.uint64]]:
    """(mask, word) of the first and second eight bytes of ``text`` (at most 16 bytes)."""
    parts = (text[:8], text[8:16])
    return (
        (np.uint64((1 << (8 * len(parts[0]))) - 1), np.uint64(int.from_bytes(parts[0], "little"))),
        (np.uint64((1 << (8 * len(parts[1]))) - 1), np.uint64(int.from_bytes(parts[1], "little"))),
    )


_CAT_WORDS = [
    (kind, _word_pattern(cat + b'"'))
    for cat, kind in [*FAST_CATS.items(), *((c, LAUNCH) for c in LAUNCH_CATS)]
]
"""(kind, word patterns) of each category read vectorized, with its closing quote."""
_NUMERIC = np.zeros(9, dtype=bool)
_NUMERIC[[_PID, _TID, _TS, _DUR, _CORRELATION]] = True
_TERMINATOR = np.zeros(256, dtype=bool)
_TERMINATOR[list(b",}] \t\r\n")] = True
"""Bytes that may follow a JSON number inside an object."""
_COLUMNS = np.arange(_WIDTH, dtype=np.int64)


class _EventFields(NamedTuple):
    """What ``_fields`` read of each event of a chunk."""

    kind: npt.NDArray[np.int64]
    """``FAST_CATS`` range kind, ``LAUNCH``, or -1."""
    name_start: npt.NDArray[np.int64]
    name_end: npt.NDArray[np.int64]
    pid: npt.NDArray[np.int64]
    tid: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    correlation: npt.NDArray[np.int64]
    fast: npt.NDArray[np.bool_]
    """Every field read cleanly: the event becomes a row without a JSON parser."""
    times_ok: npt.NDArray[np.bool_]
    """``ts`` and ``dur`` read (exact times for the events parsed as JSON)."""
    skip: npt.NDArray[np.bool_]
    """No row at all (flows, instants)."""


def _events(text: bytes, structure: _Structure, sink: RowSink) -> None:
    """The whole events of ``text`` (``{...}, {...}``): range and launch events (Python frames,
    ops, annotations, runtime calls: most of a trace) cut out vectorized, every other event
    parsed by ``orjson``; all in file order through the layout reader's ``_emit``."""
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
    got = _fields(data, structure, opens, closes)
    fast = np.flatnonzero(got.fast)
    slow = np.flatnonzero(~got.fast & ~got.skip)
    cuts = zip(got.name_start[fast].tolist(), got.name_end[fast].tolist(), strict=True)
    names = [text[a:b] for a, b in cuts]
    times = (got.start[slow], got.end[slow] - got.start[slow], got.times_ok[slow])
    row_fields = (got.pid, got.tid, got.start, got.end, got.correlation)
    _emit(
        text,
        opens - 2,  # _emit reads an event as text[open + 2 : close + 3]
        closes - 2,
        fast,
        got.kind[fast],
        tuple(column[fast] for column in row_fields),
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
) -> _EventFields:
    """Read ph, cat, name, pid, tid, ts, dur (and a launch's ``args.correlation``) of each event.

    Every key is a string right before a colon outside strings: the colons give the keys, their
    depth says whose (1: the event's own, 2: inside its one nested object, ``args``). An event
    whose fields are not each present once, plain (a string, a non-negative number without
    exponent), or whose keys are not followed directly by their colon, goes the JSON way.
    """
    arr, count = data.arr, len(opens)
    quotes = structure.quotes
    inside = np.searchsorted(structure.colons, data.size)  # the structure may run past the cut
    colons = structure.colons[:inside]
    after = structure.colon_after[:inside]
    event = np.maximum(structure.colon_event[:inside], 0)
    key_end = quotes[np.maximum(after - 1, 0)]
    tight = (after >= 2) & (key_end == colons - 1)
    loose = np.zeros(count, dtype=bool)
    loose[event[~tight]] = True  # `"key" : v` is valid JSON, but rare: the JSON way
    key_at = quotes[np.maximum(after - 2, 0)] + 1
    depth = structure.colon_depth[:inside]
    top = np.flatnonzero(tight & (depth == 1))
    words = data.word[key_at[top]]
    code = np.full(len(top), -1, dtype=np.int64)
    for key_code, mask, word in _KEY_WORDS:
        code[(words & mask) == word] = key_code
    inner = np.flatnonzero(tight & (depth == 2))
    inner = inner[key_end[inner] - key_at[inner] == 11]  # the length of "correlation"
    inner = inner[data.has(key_at[inner], b'correlation"')]
    rows = np.concatenate((top[code >= 0], inner))
    codes = np.concatenate((code[code >= 0], np.full(len(inner), _CORRELATION, dtype=np.int64)))
    if not len(rows):  # no key this path reads: every event goes the JSON way
        none = np.zeros(count, dtype=np.int64)
        no = none != 0
        return _EventFields(none - 1, none, none, none, none, none, none, none, no, no, no)
    events = event[rows]
    seen = np.bincount(codes * count + events, minlength=9 * count).reshape(9, count) == 1
    value = _skip_spaces(arr, colons[rows] + 1)
    # string values: the first quote after the colon opens it
    first_quote = np.minimum(after[rows], len(quotes) - 2)
    is_string = quotes[first_quote] == value
    value_end = np.where(is_string, quotes[first_quote + 1], -1)
    mantissa = np.zeros(len(rows), dtype=np.int64)
    fraction = np.zeros(len(rows), dtype=np.int64)
    number_ok = np.zeros(len(rows), dtype=bool)
    # pid and tid repeat over the whole trace: read once per distinct text, the rest per row
    ids = np.flatnonzero((codes == _PID) | (codes == _TID))
    mantissa[ids], number_ok[ids] = _repeated_ints(data, value[ids])
    numeric = np.flatnonzero(_NUMERIC[codes])
    numeric = numeric[~number_ok[numeric]]
    mantissa[numeric], fraction[numeric], number_ok[numeric] = _numbers_at(data, value[numeric])
    where = np.zeros((9, count), dtype=np.int64)
    where[codes, events] = np.arange(len(rows))

    def field(key_code: int) -> npt.NDArray[np.int64]:
        found: npt.NDArray[np.int64] = where[key_code]
        return found

    ph, cat, name, pid, tid, ts, dur, args, corr = (field(c) for c in range(9))
    one_letter = seen[_PH] & is_string[ph] & (value_end[ph] - value[ph] == 2) & ~loose
    phase = arr[value[ph] + 1]
    kind = np.full(count, -1, dtype=np.int64)
    cat_ok = seen[_CAT] & is_string[cat]
    cat_words = (data.word[value[cat] + 1], data.word[value[cat] + 9])
    for cat_kind, patterns in _CAT_WORDS:
        hit = cat_ok.copy()
        for words_at, (mask, word) in zip(cat_words, patterns, strict=True):
            hit &= (words_at & mask) == word
        kind[hit] = cat_kind
    fast = one_letter & (phase == 88) & (kind != -1) & seen[_NAME] & is_string[name]  # "X"
    for key_code, rows_of in ((_PID, pid), (_TID, tid)):
        fast &= seen[key_code] & number_ok[rows_of] & (fraction[rows_of] == 0)
    times_ok = seen[_TS] & seen[_DUR] & ~loose
    for rows_of in (ts, dur):
        times_ok &= number_ok[rows_of] & _fits_ns(mantissa[rows_of], fraction[rows_of])
    fast &= times_ok
    launch = kind == LAUNCH
    if launch.any():
        fast &= ~launch | _correlation_ok(data, structure, opens, seen, value[args])
        fast &= ~launch | (number_ok[corr] & (fraction[corr] == 0))
    start = np.where(times_ok, _ns(mantissa[ts], fraction[ts]), 0)
    end = start + np.where(times_ok, _ns(mantissa[dur], fraction[dur]), 0)
    return _EventFields(
        kind=kind,
        name_start=value[name] + 1,
        name_end=value_end[name],
        pid=mantissa[pid],
        tid=mantissa[tid],
        start=start,
        end=end,
        correlation=mantissa[corr],
        fast=fast,
        times_ok=times_ok,
        # Flows ("s"/"f"), instants ("i") and the like: not rows, and not metadata.
        skip=one_letter & (phase != 88) & (phase != 77),
    )


def _correlation_ok(
    data: _Bytes,
    structure: _Structure,
    opens: npt.NDArray[np.int64],
    seen: npt.NDArray[np.bool_],
    args_value: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Events whose ``args`` is an object, their only nested one, with one ``correlation``.

    With a single object one level down, every key at depth 2 is an ``args`` key, so the
    ``correlation`` found there is ``args.correlation`` and no other object's.
    """
    inner = structure.close_depth == 99
    inner &= (structure.depth == 2) & (structure.position < data.size)
    nested = structure.position[inner]
    owner = np.searchsorted(opens, nested) - 1  # >= 0: depth 2 lies inside an event
    single = np.bincount(owner, minlength=len(opens)) == 1
    only_nested = np.full(len(opens), -1, dtype=np.int64)
    only_nested[owner] = nested  # meaningful where single
    ok: npt.NDArray[np.bool_] = seen[_ARGS] & seen[_CORRELATION] & single
    ok &= only_nested == args_value
    return ok


_SMALL_INT = re.compile(rb"(0|[1-9][0-9]{0,6})[,}\] \t\r\n]")


def _repeated_ints(
    data: _Bytes, start: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Integers of up to seven digits at ``start``, parsed once per distinct 8-byte text.

    A process or thread id repeats on every event; the eight bytes from its first digit hold
    the number and what ends it, so equal words are equal numbers. Words that hold anything
    else come back not ok (the caller parses those rows one by one).
    """
    words, inverse = np.unique(data.word[start], return_inverse=True)
    values = np.full(len(words), -1, dtype=np.int64)
    for index, word in enumerate(words.tolist()):
        found = _SMALL_INT.match(int(word).to_bytes(8, "little"))
        if found:
            values[index] = int(found.group(1))
    out = values[inverse.ravel()]
    return out, out >= 0


def _numbers_at(
    data: _Bytes, start: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Parse the non-negative JSON numbers that start at ``start``.

    Returns (mantissa, digits after the dot, ok). ``ok`` is False unless the text reads
    ``digits(.digits)?`` in at most ``_WIDTH - 1`` characters followed by what may end a
    number (a comma, a closing bracket, whitespace): a sign, an exponent or ``1.`` go the JSON
    way. The shape comes from a byte window; the digits of the integer and the fraction part
    are combined eight at a time in 64-bit words (``_digits``).
    """
    g = data.columns(start)
    digit = g - np.uint8(48)  # wraps below '0', so one comparison tests the digit range
    is_digit = digit < 10
    is_dot = g == 46
    width = np.argmin(is_digit | is_dot, axis=1)  # first other column (0: none, too long)
    is_dot &= width[:, None] > _COLUMNS
    dots = np.count_nonzero(is_dot, axis=1)
    index = np.arange(len(g))
    last = np.maximum(width - 1, 0)
    ok = (width > 0) & is_digit[:, 0] & is_digit[index, last] & (dots <= 1)
    ok &= _TERMINATOR[g[index, width]]
    whole = np.where(dots > 0, np.argmax(is_dot, axis=1), width)  # digits before the dot
    ok &= whole <= 16  # (``_digits`` reads 16 at most; longer integers go the JSON way)
    fraction = width - np.minimum(whole + 1, width)
    mantissa = _digits(data, start + whole, whole) * _POW10[fraction]
    mantissa += _digits(data, start + width, fraction)
    return mantissa, fraction, ok


_ASCII_ZEROS = np.uint64(0x3030303030303030)
_KEEP_LAST = np.array([0, *(((1 << (8 * k)) - 1) << (64 - 8 * k) for k in range(1, 9))], np.uint64)
"""Mask of the last ``k`` bytes of a little-endian word (``k`` = 0..8)."""


def _digits(
    data: _Bytes, end: npt.NDArray[np.int64], count: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The value of the ``count`` (at most 16) ASCII digits that end just before ``end``.

    Each 64-bit word holds eight bytes; the bytes before the digits are set to '0', and the
    digits are combined pairwise in three multiply-shift steps (2, 4, then 8 digits), so a
    number costs a dozen vector operations instead of one per digit.
    """
    total = np.zeros(len(end), dtype=np.uint64)
    for word_at, keep, scale in ((end - 16, count - 8, 1), (end - 8, count, 10**8)):
        keep = np.clip(keep, 0, 8)
        mask = _KEEP_LAST[keep]
        word = data.word[np.maximum(word_at, 0)]  # bytes before the chunk are never kept
        word = (word & mask) | (_ASCII_ZEROS & ~mask)
        word -= _ASCII_ZEROS
        word = (word * np.uint64(10) + (word >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
        word = (word * np.uint64(100) + (word >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
        word = (word * np.uint64(10000) + (word >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
        total = total * np.uint64(scale) + word
    out: npt.NDArray[np.int64] = total.astype(np.int64)
    return out


def _skip_spaces(arr: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Advance each position past JSON whitespace (a few characters at most in practice)."""
    at = at.copy()
    moving = np.flatnonzero(_SPACE[arr[at]])
    while len(moving):
        at[moving] += 1
        moving = moving[_SPACE[arr[at[moving]]]]
    return at


_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\r\n")] = True
