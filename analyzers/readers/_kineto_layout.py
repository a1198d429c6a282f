"""Fast path of the Kineto reader: Kineto's fixed JSON layout, parsed with numpy, not per event.

Why: a PyTorch-profiler trace with ``with_stack`` is mostly Python-frame and op ranges (three
quarters of the events of the reference traces), and a JSON parser spends one to two µs per
event building dicts that the reader throws away after copying six fields. Kineto writes every
event with the same line layout (``libkineto/src/output_json.cpp``)::

      {
        "ph": "X", "cat": "python_function", "name": "x.py(3): f", "pid": 1133, "tid": 0,
        "ts": 5146681463270.626, "dur": 449648.301,
        "args": {
          "Python parent id": null, "Python id": 1, "Ev Idx": 11424
        }
      },

so ranges (``python_function``, ``cpu_op``, ``user_annotation``) and launches
(``cuda_runtime``, ``cuda_driver``: their args line ends with the correlation id) are cut out
of the decompressed bytes with vectorized searches: event boundaries from the ``{``/``}`` lines
at indent 2, the header line read backwards from its end (names may contain anything, the
numbers and keys after them may not), numbers parsed right-aligned in numpy. Everything else
is handed to the caller as parsed JSON objects, in file order, batched per chunk through
``orjson``: GPU activities (their args vary), metadata events, and any event whose text does
not match the layout exactly (a string pid, an exponent, a reordered args line). Flow and
instant events (``ph`` other than ``X``/``M``) are dropped by a byte test: the reader ignores
them anyway.

Memory stays at one chunk (``CHUNK_BYTES`` of text plus its index arrays) plus the output rows.

Anything that is not this layout raises ``LayoutMismatch`` and the caller re-reads the file with
the general streaming scanner (``_json_stream``), which also produces the precise error for a
malformed file. Times are exact: ``ts``/``dur`` text (microseconds with up to three decimals)
becomes integer nanoseconds by integer arithmetic, never through a float (``_ns``); the events
handed over as JSON carry their exact times too (``ExactNs``, cut from the same line).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from itertools import repeat

import numpy as np
import numpy.typing as npt
import orjson

from analyzers.model import LAUNCH_DTYPE, RANGE_DTYPE, RangeKind, SymbolTable

CHUNK_BYTES = 1 << 20
"""Decompressed text handled per vectorized pass (whole events only)."""
MAX_HEADER_BYTES = 64 << 20
"""Text before ``traceEvents`` (device properties, ...) larger than this: not Kineto's layout."""
MAX_EVENT_BYTES = 64 << 20
"""One event larger than this: not Kineto's layout (and bounds memory on odd input)."""

EVENTS_OPEN = b'"traceEvents": [\n'
SEPARATOR = b"\n  },\n  {\n"
FIRST_EVENT = b'  {\n    "'
EVENTS_CLOSE = b"\n  }\n  ]"
X_PREFIX = b'    "ph": "X", "cat": "'
PH_PREFIX = b'    "ph": "'
TS_PREFIX = b'    "ts": '
ARGS_OPEN = b'    "args": {'
ARGS_CLOSE = b"    }"
NAME_KEY = b'", "name": "'
PID_KEY = b'", "pid": '
TID_KEY = b', "tid": '
DUR_KEY = b', "dur": '
FAST_CATS = {
    b"python_function": int(RangeKind.PYTHON),
    b"cpu_op": int(RangeKind.CPU_OP),
    b"user_annotation": int(RangeKind.RECORD_FUNCTION),
}
"""Range categories cut out by the vectorized path (exact spelling; others go the JSON way)."""
LAUNCH = -2
LAUNCH_CATS = (b"cuda_runtime", b"cuda_driver")
"""Launch categories cut out by the vectorized path (their args line ends with the id)."""
CORRELATION_KEY = b'"correlation": '
_MAX_DIGITS = 18  # int64-safe decimal digits
_INT64_MAX = 2**63 - 1


class ExactNs(int):
    """A time already converted to integer ns from its text (not µs, not via a float): set on
    the JSON-path events of a chunk, so the row builders take it as is."""

    __slots__ = ()


class LayoutMismatch(Exception):
    """The text is not Kineto's fixed layout: read the file with the general scanner."""


@dataclass(slots=True)
class RowSink:
    """Where the vectorized rows go; ``take`` receives every other event (a parsed dict)."""

    strings: SymbolTable
    take: Callable[[object], None]
    pending: dict[str, list[tuple[object, ...]]]
    """The row lists ``take`` appends to; "ranges" and "launches" are drained after each chunk
    (merged with the vectorized rows in file order)."""
    emit: Callable[[str, npt.NDArray[np.void]], None]
    """Receives ("ranges" | "launches", rows in file order) once per chunk."""
    keeps_api: Callable[[str], bool]
    """Whether a runtime/driver API call becomes a row of the launches table (a launch or a
    host sync; every other API call makes no row)."""
    name_ids: dict[bytes, int] = field(default_factory=dict)
    launch_ids: dict[bytes, int] = field(default_factory=dict)
    """API name text -> string id, or -1 for an API the launches table does not keep."""


def read_layout(blocks: Iterator[bytes], header: dict[str, object], sink: RowSink) -> None:
    """Parse a Kineto-layout trace from its text blocks; fill ``header`` and the sink.

    :raises LayoutMismatch: the text is not in Kineto's layout (the caller starts over).
    """
    buf = b""
    for block in blocks:
        buf += block
        # The key without Kineto's spacing after it: another layout, known at once (reading
        # on would only scan the whole file for a line that never comes).
        if EVENTS_OPEN in buf or b'"traceEvents"' in buf or len(buf) > MAX_HEADER_BYTES:
            break
    found = buf.find(EVENTS_OPEN)
    if found < 0:
        raise LayoutMismatch("no traceEvents array in Kineto's layout")
    header.update(_object_text(buf[:found].rstrip().rstrip(b","), b"}"))
    buf = buf[found + len(EVENTS_OPEN) :]
    while len(buf) < len(FIRST_EVENT):  # enough text to see how the first event is indented
        block = next(blocks, b"")
        if not block:
            break
        buf += block
    if buf.lstrip(b" \t\r\n").startswith(b"{") and not buf.startswith(FIRST_EVENT):
        # The first event is not at indent 2 with its keys at indent 4 (json.dump(indent=N)):
        # another layout, known at once (not after probing megabytes for a separator).
        raise LayoutMismatch("the first event is not in Kineto's line layout")
    done = False
    first = True
    while True:
        while not done and len(buf) < CHUNK_BYTES:
            block = next(blocks, b"")  # the blocks are never empty
            done = not block
            buf += block
        if done:
            end = buf.rfind(EVENTS_CLOSE)
            if end < 0:
                raise LayoutMismatch("the traceEvents array does not end in Kineto's layout")
            _chunk(buf[: end + 5], sink)  # through "  }\n"
            _tail(buf[end + len(EVENTS_CLOSE) :], header)
            return
        cut = buf.rfind(SEPARATOR)
        if cut < 0:  # one event longer than a chunk: read on
            if len(buf) > MAX_EVENT_BYTES or (first and len(buf) > _PROBE_BYTES):
                # (before any event: most likely another indentation, not one huge event)
                raise LayoutMismatch("no event separator in Kineto's layout")
            block = next(blocks, b"")
            done = not block
            buf += block
            continue
        vectorized, events = _chunk(buf[: cut + 6], sink)  # through "  },\n"
        if first and events >= _PROBE_EVENTS and not vectorized:
            # Events at indent 2 but no line in Kineto's layout (``json.dump(indent=1)``):
            # give up now, not after sending the whole file through the JSON path.
            raise LayoutMismatch("no event of the first chunk is in Kineto's line layout")
        first = False
        buf = buf[cut + 6 :]


def _object_text(text: bytes, close: bytes) -> dict[str, object]:
    """Parse the header (text before the events, an open object) or the trailer."""
    try:
        value = orjson.loads(text + close)
    except orjson.JSONDecodeError as exc:
        raise LayoutMismatch(f"header or trailer is not Kineto's layout ({exc})") from exc
    if not isinstance(value, dict):
        raise LayoutMismatch("header is not a JSON object")
    return value


def _tail(text: bytes, header: dict[str, object]) -> None:
    """Top-level keys after the events (Kineto writes ``traceName`` there)."""
    rest = text.strip()
    if rest == b"}":
        return
    if not rest.startswith(b","):
        raise LayoutMismatch("unexpected text after the traceEvents array")
    header.update(_object_text(b"{" + rest[1:], b""))


_PROBE_BYTES = 4 * CHUNK_BYTES
"""Text of a first chunk without an event separator that makes it another layout."""
_PROBE_EVENTS = 64
"""Events in a first chunk without any in Kineto's line layout that make it another layout."""
_PAD = 64
"""Zero bytes after a chunk, so fixed-width reads past its end need no bounds checks."""
_WIDTH = _MAX_DIGITS
_POW10 = 10 ** np.arange(_MAX_DIGITS + 1, dtype=np.int64)
_COLUMNS = np.arange(_WIDTH)
_PLACE = 10 ** np.arange(_WIDTH - 1, -1, -1, dtype=np.int64)
"""Place value of each right-aligned column: 10**17 ... 10**0 (int64 holds up to 10**18)."""
_NS_LIMIT = _INT64_MAX // _POW10[3 - np.arange(4)]
"""Largest mantissa whose ns fit in int64, by digits after the dot (0..3; more: no scaling)."""
SHORT_WIDTH = 12
"""Window of the numbers that are short in practice (pid, tid, correlation id, dur: up to 11
characters, i.e. a duration below 10**8 µs with three decimals); a longer one is not ``ok``
and its event takes the JSON path, with the same result. Two thirds of the bytes a full-width
window gathers, for five of a range's six numbers."""


class _Bytes:
    """A chunk as bytes and as unaligned little-endian 8-byte words (one per offset).

    ``word[p]`` holds bytes ``p .. p+7``: comparing a masked word tests up to eight bytes at
    every candidate position with one vector operation instead of eight.
    """

    __slots__ = ("arr", "rows", "size", "text", "word")

    def __init__(self, text: bytes) -> None:
        padded = text + bytes(_PAD)
        self.text = text
        self.size = len(text)
        self.arr = np.frombuffer(padded, dtype=np.uint8)
        self.word: npt.NDArray[np.uint64] = np.ndarray(
            (len(text) + _PAD - 8,), dtype="<u8", buffer=padded, strides=(1,)
        )
        # row p = bytes p .. p+_WIDTH-1, a view: indexing it copies only the rows asked for
        self.rows = np.lib.stride_tricks.as_strided(
            self.arr, shape=(len(text) + _PAD - _WIDTH, _WIDTH), strides=(1, 1), writeable=False
        )

    def has(self, pos: npt.NDArray[np.int64], pattern: bytes) -> npt.NDArray[np.bool_]:
        """True where ``pattern`` starts at ``pos`` (positions within the chunk)."""
        hit: npt.NDArray[np.bool_] | None = None
        for k in range(0, len(pattern), 8):
            piece = pattern[k : k + 8]
            want = np.uint64(int.from_bytes(piece, "little"))
            words = self.word[pos + k] if k else self.word[pos]
            if len(piece) < 8:
                words &= np.uint64((1 << (8 * len(piece))) - 1)
            step = words == want
            hit = step if hit is None else hit & step
        assert hit is not None
        return hit

    def columns(self, start: npt.NDArray[np.int64], width: int = _WIDTH) -> npt.NDArray[np.uint8]:
        """``width`` (at most ``_WIDTH``) bytes from each start as rows of a 2-D array."""
        rows = self.rows if width == _WIDTH else self.rows[:, :width]
        out: npt.NDArray[np.uint8] = rows[start]
        return out


def _numbers(
    data: _Bytes, end: npt.NDArray[np.int64], width: int = _WIDTH
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]
]:
    """Parse the non-negative JSON numbers that end just before ``end``.

    Returns (mantissa, digits after the dot, start of the number, ok). The number is the run of
    digits and dots before ``end``; ``ok`` is False unless it reads ``digits(.digits)?`` in at
    most ``width - 1`` characters (a sign, an exponent, ``1.``, a longer number: the JSON path
    decides those). Read right-aligned, every column has a fixed power of ten. A narrower
    ``width`` (``SHORT_WIDTH``, for ids and durations) reads fewer bytes per number.
    """
    g = data.columns(np.maximum(end - width, 0), width)  # numbers never start a chunk
    digit = g - np.uint8(48)  # wraps below '0', so one comparison tests the digit range
    is_digit = digit < 10
    is_dot = g == 46
    other = ~(is_digit | is_dot)
    # the last non-number character of the window precedes the number
    before = (width - 1) - np.argmax(other[:, ::-1], axis=1)
    inside = before[:, None] < _COLUMNS[:width]
    is_dot &= inside
    size = (width - 1) - before
    ok = other.any(axis=1) & (size >= 1) & is_digit[:, -1]
    ok &= digit[np.arange(len(g)), np.minimum(before + 1, width - 1)] < 10  # no leading dot
    dots = is_dot.sum(axis=1)
    ok &= dots <= 1
    digit[~(is_digit & inside)] = 0
    # The dot reads as a 0 digit: text_value = left * 10**(f+1) + right, right < 10**f.
    text_value = digit.astype(np.int64) @ _PLACE[_WIDTH - width :]
    fraction = np.where(dots > 0, width - 1 - np.argmax(is_dot, axis=1), 0)
    right = text_value % _POW10[fraction]
    mantissa: npt.NDArray[np.int64] = (text_value - right) // np.where(dots > 0, 10, 1) + right
    return mantissa, fraction, end - size, ok


def _ns(mantissa: npt.NDArray[np.int64], fraction: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """µs text (``mantissa`` with ``fraction`` decimals) -> exact integer ns.

    Up to three decimals scale by an integer power of ten: no rounding at all. More decimals
    (below a nanosecond) round half to even, like ``round`` of the exact value. Callers check
    ``_fits_ns`` first.
    """
    out = np.empty(len(mantissa), dtype=np.int64)
    short = fraction <= 3
    out[short] = mantissa[short] * _POW10[3 - fraction[short]]
    if not short.all():
        divisor = _POW10[fraction[~short] - 3]
        quotient, remainder = np.divmod(mantissa[~short], divisor)
        twice = 2 * remainder
        up = (twice > divisor) | ((twice == divisor) & (quotient % 2 == 1))
        out[~short] = quotient + up
    return out


def _fits_ns(
    mantissa: npt.NDArray[np.int64], fraction: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Whether ``_ns`` of the number stays within int64 (else the JSON path decides)."""
    out: npt.NDArray[np.bool_] = mantissa <= _NS_LIMIT[np.minimum(fraction, 3)]
    return out


def _chunk(text: bytes, sink: RowSink) -> tuple[int, int]:
    """One run of whole events ``  {\\n ... \\n  },?\\n``: ranges vectorized, the rest as JSON.

    Returns (events read vectorized, events in the chunk)."""
    data = _Bytes(text)
    newlines = np.flatnonzero(data.arr == 10)
    if not len(newlines) or newlines[-1] != data.size - 1 or not text.startswith(b"  {\n"):
        raise LayoutMismatch("chunk does not hold whole events")
    # An event opens with a line "  {" and closes with "  }," (or "  }" for the last one):
    # found among the lines of three or four bytes, from the newlines alone (no other pass over
    # the text).
    starts = np.concatenate(([0], newlines[:-1] + 1))
    size = newlines - starts
    three = starts[size == 3]
    opens = three[data.has(three, b"  {\n")]
    four = starts[size == 4]
    closes = np.concatenate((three[data.has(three, b"  }\n")], four[data.has(four, b"  },\n")]))
    closes.sort()
    if (
        len(opens) != len(closes)
        or not text.endswith((b"\n  },\n", b"\n  }\n"))
        or not np.array_equal(closes[:-1] + 5, opens[1:])  # "  },\n" then "  {\n"
        or ((closes - opens) < 6).any()  # at least one line between
    ):
        raise LayoutMismatch("events are not one '{' ... '}' block each at indent 2")
    first = opens + 4  # the line after "  {\n"
    fast_kind = np.full(len(opens), -1, dtype=np.int64)
    cat_len = np.zeros(len(opens), dtype=np.int64)
    x_rows = np.flatnonzero(data.has(first, X_PREFIX))
    cat_at = first[x_rows] + len(X_PREFIX)
    # The category's first 8 bytes, read once: each category is then tested in full only where
    # they match (a position matches at most one category: the quote after it ends the name).
    head = data.word[cat_at]
    for cat, kind in [*FAST_CATS.items(), *((c, LAUNCH) for c in LAUNCH_CATS)]:
        pattern = cat + NAME_KEY  # at least 8 bytes: NAME_KEY alone is 12
        same = np.flatnonzero(head == np.uint64(int.from_bytes(pattern[:8], "little")))
        hit = x_rows[same[data.has(cat_at[same] + 8, pattern[8:])]]
        fast_kind[hit] = kind
        cat_len[hit] = len(cat)
    # Flows ("s"/"f"), instants ("i") and the like: not rows, and not metadata.
    phase = data.arr[first + len(PH_PREFIX)]
    skip = (
        data.has(first, PH_PREFIX)
        & (data.arr[first + len(PH_PREFIX) + 1] == 34)
        & (phase != ord("X"))
        & (phase != ord("M"))
    )
    candidates = np.flatnonzero(fast_kind != -1)
    line = _Lines(newlines, opens[candidates], closes[candidates])
    names, ok, fields = _fast_fields(data, line, cat_len[candidates], fast_kind[candidates])
    fast = candidates[ok]
    slow = ~skip
    slow[fast] = False
    slow_events = np.flatnonzero(slow)
    times = _timing_line(data, _Lines(newlines, opens[slow_events], closes[slow_events]))
    _emit(text, opens, closes, fast, fast_kind[fast], fields, names, slow_events, times, sink)
    return len(fast), len(opens)


def _timing_line(
    data: _Bytes, line: _Lines
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Exact (start ns, duration ns, ok) from the ``"ts": T, "dur": D`` line of each event.

    Kernels and the other JSON-path events keep Kineto's second line; where it reads exactly
    ``ts`` then ``dur``, their times come from the text, not from the JSON parser's float.
    """
    timing, timing_end = line.span(2)
    arr = data.arr
    dur_end = np.where(arr[timing_end - 1] == 44, timing_end - 1, timing_end)
    dur, dur_frac, dur_start, ok = _numbers(data, dur_end)
    ts_end = dur_start - len(DUR_KEY)
    ok &= (line.count >= 4) & data.has(timing, TS_PREFIX) & data.has(ts_end, DUR_KEY)
    ts, ts_frac, ts_start, ts_ok = _numbers(data, ts_end)
    ok &= ts_ok & (ts_start == timing + len(TS_PREFIX))
    ok &= _fits_ns(ts, ts_frac) & _fits_ns(dur, dur_frac)
    keep = np.flatnonzero(ok)
    start = np.zeros(len(ok), dtype=np.int64)
    duration = np.zeros(len(ok), dtype=np.int64)
    start[keep] = _ns(ts[keep], ts_frac[keep])
    duration[keep] = _ns(dur[keep], dur_frac[keep])
    return start, duration, ok


class _Lines:
    """The lines of some events: ``span(k)`` is line ``k`` of each (0: the "  {" line)."""

    __slots__ = ("count", "first", "newlines")

    def __init__(
        self,
        newlines: npt.NDArray[np.int64],
        opens: npt.NDArray[np.int64],
        closes: npt.NDArray[np.int64],
    ) -> None:
        self.newlines = newlines
        self.first = np.searchsorted(newlines, opens)  # the newline ending each "  {" line
        self.count = np.searchsorted(newlines, closes) - self.first + 1

    def span(self, k: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(start, end) of line ``k`` of each event (end: its newline; clipped to the chunk)."""
        idx = np.minimum(self.first + k, len(self.newlines) - 1)
        return self.newlines[idx - 1] + 1, self.newlines[idx]


def _fast_fields(
    data: _Bytes, line: _Lines, cat_len: npt.NDArray[np.int64], kind: npt.NDArray[np.int64]
) -> tuple[list[bytes], npt.NDArray[np.bool_], tuple[npt.NDArray[np.int64], ...]]:
    """Cut name, pid, tid, ts, dur (and a launch's correlation id) out of events.

    ``ok`` marks the events that fit the layout exactly. Returns the names and fields (pid,
    tid, start ns, end ns, correlation) of those, in order.
    """
    arr = data.arr
    header, header_end = line.span(1)
    name_start = header + len(X_PREFIX) + cat_len + len(NAME_KEY)
    # Read the header line backwards from its end: `..."name": "N", "pid": P, "tid": T,`
    # (names may contain anything; the numbers and keys after them may not).
    ok = arr[header_end - 1] == 44
    tid, tid_frac, tid_start, tid_ok = _numbers(data, header_end - 1, SHORT_WIDTH)
    pid_end = tid_start - len(TID_KEY)
    ok &= tid_ok & data.has(pid_end, TID_KEY)
    pid, pid_frac, pid_start, pid_ok = _numbers(data, pid_end, SHORT_WIDTH)
    name_end = pid_start - len(PID_KEY)
    ok &= pid_ok & data.has(name_end, PID_KEY) & (name_end >= name_start)
    # pid/tid must be integers: the JSON path would truncate "1.5" with int().
    ok &= (pid_frac == 0) & (tid_frac == 0)
    timing, timing_end = line.span(2)
    ok &= data.has(timing, TS_PREFIX)
    lines = line.count
    args_open, args_open_end = line.span(3)
    args_close, args_close_end = line.span(5)
    dur_end = np.where(lines == 7, timing_end - 1, timing_end)
    with_args = (
        (lines == 7)
        & (arr[timing_end - 1] == 44)
        & (args_open_end - args_open == len(ARGS_OPEN))
        & data.has(args_open, ARGS_OPEN)
        & (args_close_end - args_close == len(ARGS_CLOSE))
        & data.has(args_close, ARGS_CLOSE)
    )
    ok &= with_args | (lines == 4)
    dur, dur_frac, dur_start, dur_ok = _numbers(data, dur_end, SHORT_WIDTH)
    ts_end = dur_start - len(DUR_KEY)
    ok &= dur_ok & data.has(ts_end, DUR_KEY)
    ts, ts_frac, ts_start, ts_ok = _numbers(data, ts_end)
    ok &= ts_ok & (ts_start == timing + len(TS_PREFIX))
    ok &= _fits_ns(ts, ts_frac) & _fits_ns(dur, dur_frac)
    # A launch's args line ends with its correlation id (Kineto writes it last).
    launch = kind == LAUNCH
    correlation, corr_frac, corr_start, corr_ok = _numbers(data, line.span(4)[1], SHORT_WIDTH)
    corr_ok &= (
        with_args & (corr_frac == 0) & data.has(corr_start - len(CORRELATION_KEY), CORRELATION_KEY)
    )
    ok &= ~launch | corr_ok
    keep = np.flatnonzero(ok)
    start = _ns(ts[keep], ts_frac[keep])
    end = start + _ns(dur[keep], dur_frac[keep])
    cuts = zip(name_start[keep].tolist(), name_end[keep].tolist(), strict=True)
    text = data.text
    names = [text[a:b] for a, b in cuts]
    return names, ok, (pid[keep], tid[keep], start, end, correlation[keep])


def _decode_name(raw: bytes) -> str:
    """The string a JSON parser makes of the name's text (checked once per distinct name)."""
    if b"\\" in raw:
        # Escapes: JSON decodes them (and rejects an unescaped quote among them).
        value = orjson.loads(b'"' + raw + b'"')
        assert isinstance(value, str)
        return value
    if b'"' in raw:
        # An unescaped quote: the line holds more than one string, not Kineto's layout.
        raise LayoutMismatch("a name holds an unescaped quote")
    return raw.decode("utf-8")


def _emit(
    text: bytes,
    opens: npt.NDArray[np.int64],
    closes: npt.NDArray[np.int64],
    fast: npt.NDArray[np.int64],
    kinds: npt.NDArray[np.int64],
    fields: tuple[npt.NDArray[np.int64], ...],
    names: list[bytes],
    slow_events: npt.NDArray[np.int64],
    times: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]],
    sink: RowSink,
) -> None:
    """Hand events to the sink in file order (names are interned in order of appearance)."""
    parsed: list[object] = []
    if len(slow_events):
        starts = (opens[slow_events] + 2).tolist()  # the "{"
        ends = (closes[slow_events] + 3).tolist()  # through the "}"
        pieces = [text[a:b] for a, b in zip(starts, ends, strict=True)]
        joined = b",".join(pieces)
        try:
            parsed = orjson.loads(b"[" + joined + b"]")
        except orjson.JSONDecodeError as exc:
            raise LayoutMismatch(f"an event is not valid JSON ({exc})") from exc
        set_exact_times(parsed, *times, texts=pieces)
    is_launch = kinds == LAUNCH
    name_of = np.empty(len(names), dtype=np.int64)
    for table, rows in ((sink.name_ids, ~is_launch), (sink.launch_ids, is_launch)):
        where = np.flatnonzero(rows)
        known = map(table.get, [names[i] for i in where.tolist()], repeat(-3))
        name_of[where] = np.fromiter(known, np.int64, len(where))  # -3: not seen yet
    # New names get ids in order of first appearance, interleaved with the JSON-path events
    # (which intern their names too), so ids match what a one-by-one read assigns.
    new = np.flatnonzero(name_of == -3)
    events = np.concatenate((fast[new], slow_events))
    from_fast = np.concatenate((np.ones(len(new), bool), np.zeros(len(slow_events), bool)))
    sequence = np.argsort(events, kind="stable")
    ordered = events[sequence]
    # for each JSON-path event: the vectorized ranges / launch candidates before it
    ranges_before = np.searchsorted(fast[~is_launch], ordered).tolist()
    launches_before = np.searchsorted(fast[is_launch], ordered).tolist()
    slow_ranges, slow_launches = sink.pending["ranges"], sink.pending["launches"]
    range_at: list[int] = []
    launch_at: list[int] = []
    new_iter, slow_iter = iter(new.tolist()), iter(parsed)
    try:
        for step, from_vector in enumerate(from_fast[sequence].tolist()):
            if from_vector:
                row = next(new_iter)
                name_of[row] = _name_id(names[row], bool(is_launch[row]), sink)
                continue
            had_ranges, had_launches = len(slow_ranges), len(slow_launches)
            sink.take(next(slow_iter))
            range_at.extend([ranges_before[step]] * (len(slow_ranges) - had_ranges))
            launch_at.extend([launches_before[step]] * (len(slow_launches) - had_launches))
    except (UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise LayoutMismatch(f"a name is not a valid JSON string ({exc})") from exc
    pid, tid, start, end, correlation = fields
    picked = ~is_launch
    ranges = np.empty(int(picked.sum()), dtype=RANGE_DTYPE)
    ranges["kind"] = kinds[picked]
    ranges["rank"] = -1
    ranges["process"] = pid[picked]
    ranges["thread"] = tid[picked]
    ranges["start"] = start[picked]
    ranges["end"] = end[picked]
    ranges["name"] = name_of[picked]
    ranges["parent"] = -1
    ranges["depth"] = 0
    launches = np.empty(int(is_launch.sum()), dtype=LAUNCH_DTYPE)
    launches["rank"] = -1
    launches["process"] = pid[is_launch]
    launches["thread"] = tid[is_launch]
    launches["start"] = start[is_launch]
    launches["end"] = end[is_launch]
    launches["correlation"] = correlation[is_launch]
    launches["api"] = name_of[is_launch]
    launches["sync"] = False  # set from the API names once the file is read
    keep = name_of[is_launch] >= 0  # APIs the launches table does not keep make no row
    if slow_ranges:
        ranges = np.insert(ranges, range_at, np.array(slow_ranges, dtype=RANGE_DTYPE))
        slow_ranges.clear()
    if slow_launches:
        launches = np.insert(launches, launch_at, np.array(slow_launches, dtype=LAUNCH_DTYPE))
        keep = np.insert(keep, launch_at, True)
        slow_launches.clear()
    if len(ranges):
        sink.emit("ranges", ranges)
    if keep.any():
        sink.emit("launches", launches[keep])


def set_exact_times(
    events: list[object],
    start: npt.NDArray[np.int64],
    duration: npt.NDArray[np.int64],
    ok: npt.NDArray[np.bool_],
    texts: list[bytes] | None = None,
) -> None:
    """Replace the parsed (float) ``ts``/``dur`` of each event by its exact ns where known.

    Where the vectorized cut could not read them (a number longer than ``_WIDTH - 1``
    characters, such as epoch microseconds with decimals), the event's own text is searched
    and the number read as a ``Decimal``: no event keeps a float time that had exact text.
    """
    for index in np.flatnonzero(ok).tolist():
        event = events[index]
        if isinstance(event, dict) and "ts" in event:
            event["ts"] = ExactNs(int(start[index]))
            if "dur" in event:
                event["dur"] = ExactNs(int(duration[index]))
    if texts is None:
        return
    for index in np.flatnonzero(~ok).tolist():
        event = events[index]
        if not (isinstance(event, dict) and isinstance(event.get("ts"), float)):
            continue
        if event.get("ph") != "X":  # metadata and the like: their times make no row
            continue
        for key in ("ts", "dur"):
            found = _TIME_TEXT[key].search(texts[index])
            if found and isinstance(event.get(key), float):
                event[key] = ExactNs(_decimal_ns(found.group(1)))


_TIME_TEXT = {
    key: re.compile(
        rb'"' + key.encode() + rb'"[ \t\r\n]*:[ \t\r\n]*([0-9]+(?:\.[0-9]+)?)(?![0-9.eE])'
    )
    for key in ("ts", "dur")
}


def _decimal_ns(text: bytes) -> int:
    """Decimal µs text -> ns, rounded half to even below a nanosecond."""
    scaled = Decimal(text.decode()) * 1000
    return int(scaled.to_integral_value(ROUND_HALF_EVEN))


def _name_id(raw: bytes, launch: bool, sink: RowSink) -> int:
    """String id of a name seen for the first time (-1: an API that launches nothing)."""
    table = sink.launch_ids if launch else sink.name_ids
    found = table.get(raw)
    if found is None:
        name = _decode_name(raw)
        found = -1 if launch and not sink.keeps_api(name) else sink.strings.intern(name)
        table[raw] = found
    return found
