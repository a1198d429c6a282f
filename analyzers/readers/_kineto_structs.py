"""First path of the Kineto reader: whole events of any JSON layout decoded by ``msgspec`` into
typed structs, a chunk at a time, and the rows built column by column with numpy.

Why: the reader needs seven fields of an event (``ph``, ``cat``, ``name``, ``pid``, ``tid``,
``ts``, ``dur``) and six of its ``args``. A JSON parser that builds a dict per event spends most
of its time on the keys and values the reader throws away (``Python id``, ``Ev Idx``, flow
events); ``msgspec`` decoding into a ``Struct`` that names only those fields skips the others
inside its C scanner, and structs made with ``gc=False`` cost the garbage collector nothing.
It reads any layout alike (Kineto's own lines, ``indent=N``, compact, sorted keys, CRLF), so a
re-serialized trace reads as fast as Kineto's.

Two decoders: ``_TAGGED_DECODER`` has one struct type per category (a tagged union on
``cat``), so an event's route is its type, a Python frame is decoded without ``args``, and the
events no table reads (flow events, ...) are structs without fields; the smaller structs also
keep a chunk's per-field passes in cache. What it does not know fails its validation and the
chunk is decoded again by ``_DECODER`` (one struct for every event, routed by ``cat`` and
``ph`` as ``kineto._take`` routes them). Both give the same rows.

Chunks: the text is cut after an event's closing brace followed by a comma and the next
event's opening brace (``}`` ``,`` ``{`` with any whitespace). A cut found inside a string or
inside an event's ``args`` leaves the text before it unbalanced (an unterminated string, an
unclosed brace), so its decode fails: a chunk that decodes as a list of events was cut between
two events. The end of ``traceEvents`` is the first ``}`` ``]`` after which the same holds.
A chunk is decoded where it lies, in the one buffer the blocks are appended to (the ``[`` and
``]`` the decoder needs are written over the bytes around it): copying each megabyte to cut
and bracket it cost about a tenth of the read.

Times stay exact: ``ts``/``dur`` are kept as the raw text of the number (``msgspec.Raw``) and
converted to integer ns by integer arithmetic (``_kineto_layout._numbers``, ``_ns``), never
through a float; a number that does not read as ``digits(.digits)?`` is read as a ``Decimal``,
as the streaming scanner reads it.

This path reads clean traces only. Anything the other paths would count as a skipped event or
treat specially (a non-integer pid on a range, a ``null`` where a number belongs, a time beyond
int64, an event that is not an object, malformed JSON) raises ``StructMismatch``, and the
caller reads the file with the layout and chunk paths and the streaming scanner, which decide
those cases (and name the position of a syntax error).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from functools import reduce
from itertools import compress
from operator import or_
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from analyzers.model import (
    ACTIVITY_DTYPE,
    LAUNCH_DTYPE,
    RANGE_DTYPE,
    ActivityKind,
    RangeKind,
    SymbolTable,
)
from analyzers.readers._kineto_layout import _WIDTH, _fits_ns, _ns

CHUNK_BYTES = 1 << 20
"""Text decoded per ``msgspec`` call (whole events only)."""
MAX_HEADER_BYTES = 64 << 20
"""Text before ``traceEvents`` larger than this: left to the other paths."""
MAX_EVENT_BYTES = 64 << 20
"""Text without a cut between two events larger than this: left to the other paths."""
MAX_RETRIES = 64
"""Cuts tried per chunk (one found inside a string or ``args`` fails, the one before is tried)."""
MAX_FAILED_CUTS = 256
"""Cuts that failed in one file past which it is left to the other paths (bounds the work on
text made to mislead)."""

_UNSET = msgspec.UNSET
_EMPTY = msgspec.Raw(b"")
_INT64_MAX = 2**63 - 1
_INT16 = (-(2**15), 2**15 - 1)


class StructMismatch(Exception):
    """Not a clean trace for this path: read the file with the other paths."""


class _Args(msgspec.Struct, gc=False):
    correlation: int | msgspec.UnsetType | None = _UNSET
    device: int | msgspec.UnsetType = _UNSET
    stream: int | msgspec.UnsetType = _UNSET
    graph_node: int | msgspec.UnsetType = msgspec.field(default=_UNSET, name="graph node id")
    size: int | msgspec.UnsetType = msgspec.field(default=_UNSET, name="bytes")
    external: msgspec.Raw = msgspec.field(default=_EMPTY, name="External id")
    name: msgspec.Raw = _EMPTY


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str = ""
    pid: int | str | msgspec.UnsetType | None = _UNSET
    tid: int | str | msgspec.UnsetType | None = _UNSET
    ts: msgspec.Raw = _EMPTY
    dur: msgspec.Raw = _EMPTY
    args: _Args | None = None


_DECODER = msgspec.json.Decoder(list[_Event])
_NO_ARGS = _Args()

# Route codes of an event (``ph`` "X" unless said otherwise).
_NONE, _RANGE, _LAUNCH, _ACTIVITY, _GPU_RANGE = 0, 1, 2, 3, 4
_RANGE_KINDS = {
    "user_annotation": RangeKind.RECORD_FUNCTION,
    "python_function": RangeKind.PYTHON,
    "python": RangeKind.PYTHON,
    "cpu_op": RangeKind.CPU_OP,
    "operator": RangeKind.CPU_OP,
}
_ACTIVITY_KINDS = {
    "kernel": ActivityKind.KERNEL,
    "gpu_memcpy": ActivityKind.MEMCPY,
    "memcpy": ActivityKind.MEMCPY,
    "gpu_memset": ActivityKind.MEMSET,
    "memset": ActivityKind.MEMSET,
}
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver")
"""The categories ``kineto`` routes (lower case; the same tables as its ``_ROUTES``)."""


def _route(cat: str | None) -> int:
    """Route code * 16 + row kind of an "X" event's category, as ``kineto._take`` routes it."""
    if not isinstance(cat, str):
        return _NONE
    for key in (cat, cat.lower()):
        if key in _RANGE_KINDS:
            return _RANGE * 16 + int(_RANGE_KINDS[key])
        if key in _ACTIVITY_KINDS:
            return _ACTIVITY * 16 + int(_ACTIVITY_KINDS[key])
        if key in _LAUNCH_CATS:
            return _LAUNCH * 16
    if cat == "gpu_user_annotation":
        return _GPU_RANGE * 16
    return _NONE


# The tagged decoder: one struct type per category (the ``cat`` value picks it inside the
# decoder), so an event's route is its type, a Python frame carries no ``args`` and no ``cat``
# string, and a flow event becomes a struct without fields. Structs this small are also what
# makes the per-field passes over a chunk cheap (they stay in cache). A category it does not
# know (or one cased differently), an event without ``cat``, a row category whose ``ph`` is not
# "X", a skipped category whose ``ph`` is "M" (metadata), or a range or launch whose pid/tid is
# not an integer fails validation: that chunk is decoded again with ``_DECODER``, which routes
# it as ``kineto._take`` does.


class _LaunchArgs(msgspec.Struct, gc=False):
    correlation: int | msgspec.UnsetType | None = _UNSET


class _TaggedRow(msgspec.Struct, gc=False, kw_only=True, tag_field="cat"):
    ph: Literal["X"]
    ts: msgspec.Raw
    name: str = ""
    dur: msgspec.Raw = _EMPTY


class _TaggedRange(_TaggedRow, kw_only=True):
    pid: int
    tid: int


class _TaggedLaunch(_TaggedRange, kw_only=True):
    args: _LaunchArgs | None = None


class _TaggedGpu(_TaggedRow, kw_only=True):
    """Kernels, memcpys, memsets and GPU annotations: pid/tid may be absent (device and
    stream come from ``args``)."""

    pid: int | msgspec.UnsetType = _UNSET
    tid: int | msgspec.UnsetType = _UNSET
    args: _Args | None = None


_PHASES = (
    "B",
    "E",
    "X",
    "i",
    "I",
    "C",
    "b",
    "n",
    "e",
    "s",
    "t",
    "f",
    "P",
    "O",
    "N",
    "D",
    "V",
    "v",
    "R",
    "c",
    "(",
    ")",
)
"""Chrome trace phases other than "M" (metadata, which ``_DECODER`` reads)."""


class _TaggedSkip(msgspec.Struct, gc=False, tag_field="cat"):
    ph: Literal[_PHASES] | None = None  # type: ignore[valid-type]


_SKIPPED_CATS = (
    "ac2g",
    "fwdbwd",
    "Trace",
    "overhead",
    "cuda_sync",
    "cpu_instant_event",
    "external_correlation",
    "cuda_profiler_range",
    "gpu_pm_counter",
    "collective_comm",
    "mtia_runtime",
    "mtia_ccp_events",
    "glow_runtime",
    "hpu_op",
    "xpu_runtime",
    "xpu_driver",
    "privateuse1_runtime",
    "privateuse1_driver",
)
"""Categories Kineto writes that make no row (``_route`` checks it below)."""


class _Routes(dict[str | None, int]):
    """An "X" event's category -> route code * 16 + row kind, computed once per category."""

    def __missing__(self, cat: str | None) -> int:
        found = self[cat] = _route(cat)
        return found


def _tagged_types() -> dict[type, int]:
    """Struct type of each category -> its route code (as ``_route``), one type per tag."""
    bases = {_RANGE: _TaggedRange, _LAUNCH: _TaggedLaunch, _ACTIVITY: _TaggedGpu}
    types: dict[type, int] = {}
    for cat in (*_RANGE_KINDS, *_ACTIVITY_KINDS, *_LAUNCH_CATS, "gpu_user_annotation"):
        route = _route(cat)
        base = bases.get(route >> 4, _TaggedGpu)
        types[msgspec.defstruct(f"_Tagged_{cat}", [], bases=(base,), tag=cat)] = route
    for cat in _SKIPPED_CATS:
        if _route(cat) != _NONE:
            raise RuntimeError(f"category {cat!r} makes rows: not a skipped category")
        types[msgspec.defstruct(f"_Skip_{cat}", [], bases=(_TaggedSkip,), tag=cat)] = _NONE
    return types


_TYPE_ROUTES = _tagged_types()
_TaggedEvent: Any = reduce(or_, _TYPE_ROUTES)
_TAGGED_DECODER = msgspec.json.Decoder(list[_TaggedEvent])
MAX_UNTAGGED_CHUNKS = 4
"""Chunks the tagged decoder failed on past which the file's other chunks go straight to
``_DECODER`` (a trace of categories it does not know would be decoded twice)."""


class _Interned(dict[str, int]):
    """Name -> string id over the whole file: one lookup per row (names repeat over chunks),
    new names interned in order of first appearance."""

    def __init__(self, strings: SymbolTable) -> None:
        super().__init__()
        self.strings = strings

    def __missing__(self, name: str) -> int:
        found = self[name] = self.strings.intern(name)
        return found


@dataclass(slots=True)
class StructSink:
    """Where the rows of each chunk go, in file order."""

    strings: SymbolTable
    keeps_api: Callable[[str], bool]
    """Whether a runtime/driver API call becomes a row of the launches table."""
    emit: Callable[[str, npt.NDArray[np.void]], None]
    """Receives ("activities" | "launches" | "ranges", rows in file order) once per chunk."""
    gpu_ranges: list[tuple[object, ...]]
    thread_names: dict[int, str]
    interned: dict[str, int] = field(default_factory=dict)
    """Name -> string id, filled as the file is read (``_Interned``)."""


@dataclass(slots=True)
class _Progress:
    """What the read of one file has found so far."""

    routes: _Routes = field(default_factory=_Routes)
    failed_cuts: int = 0
    """Cuts that did not decode (``MAX_FAILED_CUTS``)."""
    untagged: int = 0
    """Chunks the tagged decoder failed on (``MAX_UNTAGGED_CHUNKS``)."""


_Events = tuple[list[Any], bool]
"""A chunk's events, and whether the tagged decoder read them (else ``_DECODER``)."""


def read_structs(blocks: Iterator[bytes], header: dict[str, object], sink: StructSink) -> None:
    """Read a JSON trace from its text blocks; fill ``header`` and the sink.

    :raises StructMismatch: not a clean trace for this path (the caller starts over).
    """
    prefix, first = _find_events(blocks)
    # One growing buffer, decoded in place: byte 0 is the ``[`` the decoder needs before the
    # events (the byte before an event is whitespace or a comma, overwritten with it), and the
    # byte after the cut's ``}`` becomes the ``]`` while the chunk decodes. No chunk is copied
    # to be decoded; the text left after a cut moves to the front (``bytearray`` drops its
    # head without a copy).
    buf = bytearray(b"[")
    buf += first
    progress = _Progress()
    sink.interned = _Interned(sink.strings)
    done = False
    while True:
        while not done and len(buf) < CHUNK_BYTES:
            block = next(blocks, b"")
            done = not block
            buf += block
        if done:
            events, rest = _last_events(buf, progress)
            _rows(events, progress, sink)
            _header(prefix, rest, header)
            return
        cut = _cut(buf, progress)
        if cut is None:
            if len(buf) > MAX_EVENT_BYTES:
                raise StructMismatch("no cut between two events within the event limit")
            block = next(blocks, b"")
            done = not block
            buf += block
            continue
        events, end = cut
        _rows(events, progress, sink)
        del events, cut  # their raw texts hold views of buf
        del buf[: end - 1]
        buf[0] = 0x5B  # "[": the byte before the next event (whitespace or a comma)


_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_SEPARATOR = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_ARRAY_END = re.compile(rb"\}[ \t\r\n]*\]")
_TAIL_WINDOW = 1 << 16
_EMPTY_END = re.compile(rb"[ \t\r\n]*\]")
_CLOSE = 0x5D  # "]"


def _find_events(blocks: Iterator[bytes]) -> tuple[bytes, bytes]:
    """(the text before the events array's ``[``, the text after it read so far)."""
    buf = b""
    for block in blocks:
        buf += block
        head = buf.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
        if head and head != b"{":
            raise StructMismatch("the document is not a JSON object")
        found = _EVENTS_KEY.search(buf)
        if found:
            return buf[: found.start()], buf[found.end() :]
        if len(buf) > MAX_HEADER_BYTES:
            break
    raise StructMismatch("no traceEvents array")


def _decode(buf: bytearray, close: int, progress: _Progress) -> _Events | None:
    """The events of ``buf[:close]`` closed by a ``]`` at ``close`` (``buf[0]`` is the
    ``[``), or None when that is not a JSON array (a wrong cut). The byte at ``close`` is
    restored.

    :raises StructMismatch: valid JSON whose events this path does not read.
    """
    kept = buf[close]
    buf[close] = _CLOSE
    try:
        # The events' raw ``ts``/``dur`` texts are views of ``buf``: it may not be resized
        # until they are gone (the caller drops the events before it moves the text).
        view = memoryview(buf)[: close + 1]
        if progress.untagged < MAX_UNTAGGED_CHUNKS:
            try:
                return _TAGGED_DECODER.decode(view), True
            except msgspec.ValidationError:
                progress.untagged += 1
        return _DECODER.decode(view), False
    except msgspec.ValidationError as exc:
        raise StructMismatch(f"an event this path does not read ({exc})") from exc
    except msgspec.DecodeError:
        return None
    finally:
        buf[close] = kept


def _cut(buf: bytearray, progress: _Progress) -> tuple[_Events, int] | None:
    """(the events before the last cut of ``buf`` that decodes, where the next one starts);
    None when no cut of ``buf`` decodes (one event longer than the text so far: read on)."""
    window = min(_TAIL_WINDOW, len(buf) - 1)
    while True:
        start = len(buf) - window
        cuts = [m.start() for m in _SEPARATOR.finditer(buf, start)]
        if cuts or window == len(buf) - 1:
            break
        window = min(2 * window, len(buf) - 1)
    for at in reversed(cuts[-MAX_RETRIES:]):
        events = _decode(buf, at + 1, progress)
        if events is not None:
            return events, buf.index(b"{", at + 1)
        progress.failed_cuts += 1
        if progress.failed_cuts > MAX_FAILED_CUTS:
            raise StructMismatch("too many cuts of the text do not decode as whole events")
    return None


def _last_events(buf: bytearray, progress: _Progress) -> tuple[_Events, bytes]:
    """(the last events, the text after the events array's ``]``); ``buf[0]`` is the ``[``."""
    empty = _EMPTY_END.match(buf, 1)
    if empty:
        return ([], True), bytes(buf[empty.end() :])
    for tries, found in enumerate(_ARRAY_END.finditer(buf, 1)):
        if tries >= MAX_RETRIES:
            break
        events = _decode(buf, found.start() + 1, progress)
        if events is not None:
            return events, bytes(buf[found.end() :])
    raise StructMismatch("the traceEvents array does not end")


def _header(prefix: bytes, rest: bytes, header: dict[str, object]) -> None:
    """The top-level keys before and after the events (the document without its events)."""
    try:
        document = orjson.loads(prefix + b'"traceEvents": []' + rest)
    except orjson.JSONDecodeError as exc:
        raise StructMismatch(f"the text around the events is not a JSON object ({exc})") from exc
    if not isinstance(document, dict) or document.get("traceEvents") != []:
        raise StructMismatch("the traceEvents found is not the document's own")
    del document["traceEvents"]
    header.update(document)


def _rows(chunk: _Events, progress: _Progress, sink: StructSink) -> None:
    """The rows of one chunk's events, table by table, in file order."""
    events, tagged = chunk
    if not events:
        return
    if tagged:
        _tagged_rows(events, sink)
    else:
        _untagged_rows(events, progress.routes, sink)


def _tagged_rows(events: list[Any], sink: StructSink) -> None:
    """Rows of events the tagged decoder read: the route is the type; ranges and launches
    hold integer pid/tid (the decoder checked)."""
    count = len(events)
    routed = np.fromiter(map(_TYPE_ROUTES.__getitem__, map(type, events)), np.int8, count)
    rows = routed != _NONE
    if rows.all():
        chosen = events
    elif rows.any():
        chosen = list(compress(events, rows.tolist()))
        routed = routed[rows]
    else:
        return
    _build(
        chosen, routed, _int_ids([e.pid for e in chosen]), _int_ids([e.tid for e in chosen]), sink
    )


def _untagged_rows(events: list[_Event], routes: _Routes, sink: StructSink) -> None:
    """Rows of events ``_DECODER`` read, routed by category and phase (``kineto._take``)."""
    count = len(events)
    phases = [e.ph for e in events]
    routed = np.fromiter(map(routes.__getitem__, [e.cat for e in events]), np.int8, count)
    routed[~np.fromiter(map("X".__eq__, phases), bool, count)] = _NONE
    if "M" in phases:  # metadata events: a few dozen, at the start of Kineto's files
        for index in np.flatnonzero(np.fromiter(map("M".__eq__, phases), bool, count)).tolist():
            _metadata(events[index], sink)
    rows = routed != _NONE
    if not rows.any():
        return
    chosen = list(compress(events, rows.tolist()))
    _build(chosen, routed[rows], _ids([e.pid for e in chosen]), _ids([e.tid for e in chosen]), sink)


def _build(
    chosen: list[Any],
    routed: npt.NDArray[np.int8],
    pid: npt.NDArray[np.int64],
    tid: npt.NDArray[np.int64],
    sink: StructSink,
) -> None:
    """The table rows of the chosen events (route code * 16 + kind each), in file order."""
    code, kind = routed >> 4, routed & 15
    start, end = _times(chosen)
    names = [e.name for e in chosen]
    keep = _launch_rows(chosen, code, names, sink)
    if not keep.all():
        chosen = list(compress(chosen, keep.tolist()))
        code, kind, start, end = code[keep], kind[keep], start[keep], end[keep]
        pid, tid = pid[keep], tid[keep]
        names = list(compress(names, keep.tolist()))
    name_ids = np.fromiter(map(sink.interned.__getitem__, names), np.int32, len(names))
    _ranges(code == _RANGE, kind, pid, tid, start, end, name_ids, sink)
    _launches(code == _LAUNCH, chosen, pid, tid, start, end, name_ids, sink)
    _activities(code == _ACTIVITY, chosen, kind, pid, tid, start, end, name_ids, sink)
    for index in np.flatnonzero(code == _GPU_RANGE).tolist():
        event = chosen[index]
        sink.gpu_ranges.append(
            (
                -1,
                int(pid[index]) if event.pid is not _UNSET else -1,
                int(tid[index]) if event.tid is not _UNSET else -1,
                int(start[index]),
                int(end[index]),
                int(name_ids[index]),
                _external(event.args),
            )
        )


_MISSING_ID = np.iinfo(np.int64).min
"""Placeholder of an absent pid/tid (only GPU annotations may lack them)."""


def _int_ids(values: list[int | msgspec.UnsetType]) -> npt.NDArray[np.int64]:
    """pid or tid column of tagged events: integers, absent only on GPU rows."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError as exc:
        raise StructMismatch("a pid or tid beyond int64") from exc
    except TypeError:  # an absent one (``UNSET``)
        return _ids(values)  # type: ignore[arg-type]


def _ids(values: list[int | str | msgspec.UnsetType | None]) -> npt.NDArray[np.int64]:
    """pid or tid column: integers only (a string or ``null`` on a row: the other paths)."""
    if set(map(type, values)) == {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError as exc:
            raise StructMismatch("a pid or tid beyond int64") from exc
    if not all(type(v) is int or v is _UNSET for v in values):
        raise StructMismatch("a pid or tid that is not an integer")
    return _ids([_MISSING_ID if v is _UNSET else v for v in values])


def _launch_rows(
    chosen: list[Any], code: npt.NDArray[np.int8], names: list[str], sink: StructSink
) -> npt.NDArray[np.bool_]:
    """Which events make rows: all but the API calls without a correlation id or whose API the
    launches table does not keep (``kineto._launch``)."""
    keep = np.ones(len(chosen), dtype=bool)
    where = np.flatnonzero(code == _LAUNCH)
    if not len(where):
        return keep
    calls = where.tolist()
    apis = {name: sink.keeps_api(name) for name in {names[i] for i in calls}}
    # ``correlation`` is an int, absent (``UNSET``) or ``null`` (the struct's type)
    keep[where] = [
        (args := chosen[i].args) is not None and type(args.correlation) is int and apis[names[i]]
        for i in calls
    ]
    return keep


def _times(chosen: list[_Event]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Exact (start ns, end ns) of the events: ``ts`` required, ``dur`` 0 when absent."""
    start = _exact_ns([e.ts for e in chosen], required=True)
    duration = _exact_ns([e.dur for e in chosen], required=False)
    if ((duration > 0) & (start > _INT64_MAX - duration)).any():
        raise StructMismatch("an end time beyond int64")
    return start, start + duration


_COMMA, _DOT, _ZERO, _NINE = 0x2C, 0x2E, 0x30, 0x39


def _exact_ns(values: list[msgspec.Raw], *, required: bool) -> npt.NDArray[np.int64]:
    """µs number texts -> integer ns, vectorized; the texts it cannot read, one by one.

    A JSON number made only of digits and at most one dot (what Kineto and ``json.dumps``
    write) is its digits without the dot (``numpy.fromstring``, base 10) scaled by its decimals
    (``_kineto_layout._ns``); any other text (a sign, an exponent, more than 18 characters)
    goes through ``_decimal_ns``; no text at all is 0 (``dur``) or refused (``ts``). The texts
    are valid JSON values (``msgspec`` checked them), so a number holds at most one dot, and
    a text of only digits, dots and the joining commas is a list of such numbers (a string,
    ``null``, a list or an object has a byte outside ``,`` to ``9`` or a sign).
    """
    count = len(values)
    text = b",".join(values)
    arr = np.frombuffer(text, dtype=np.uint8)
    separators = np.flatnonzero(arr == _COMMA)
    dots = np.flatnonzero(arr == _DOT)
    if (
        len(separators) != count - 1
        or not len(arr)
        or arr.min() < _COMMA
        or arr.max() > _NINE
        or len(separators) + len(dots) + np.count_nonzero(arr >= _ZERO) != len(arr)
    ):
        return _exact_ns_one_by_one(values, required=required)
    ends = np.empty(count, dtype=np.int64)
    ends[:-1] = separators
    ends[-1] = len(arr)
    starts = np.empty(count, dtype=np.int64)
    starts[0] = 0
    starts[1:] = separators + 1
    if len(dots) == count:  # one dot in every number
        fraction = ends - dots - 1
    else:
        fraction = np.zeros(count, dtype=np.int64)
        if len(dots):
            owner = np.searchsorted(starts, dots, "right") - 1
            fraction[owner] = ends[owner] - dots - 1
    lengths = ends - starts
    empty = lengths == 0
    if required and empty.any():
        raise StructMismatch("an event without ts")
    odd = lengths > _WIDTH  # beyond int64's digits: read as a Decimal
    out = np.zeros(count, dtype=np.int64)
    plain = ~(empty | odd)
    if not plain.all():
        text = b",".join(compress(values, plain.tolist()))
        fraction = fraction[plain]
    if text:
        mantissa = np.fromstring(text.replace(b".", b""), dtype=np.int64, sep=",")
        if (fraction == 3).all():  # Kineto's own times: the digits are the ns
            if plain.all():
                out = mantissa
            else:
                out[plain] = mantissa
        else:
            fits = _fits_ns(mantissa, fraction)
            where = np.flatnonzero(plain)
            out[where[fits]] = _ns(mantissa[fits], fraction[fits])
            odd[where[~fits]] = True
    for index in np.flatnonzero(odd).tolist():
        out[index] = _one_ns(values[index], required=required)
    return out


def _exact_ns_one_by_one(values: list[msgspec.Raw], *, required: bool) -> npt.NDArray[np.int64]:
    """``_exact_ns`` of texts among which some are no plain number (strings, ``null``, ...)."""
    plain = [_PLAIN_NUMBER.fullmatch(bytes(v)) is not None for v in values]
    out = np.zeros(len(values), dtype=np.int64)
    numbers = [v for v, ok in zip(values, plain, strict=True) if ok]
    if numbers:
        out[np.flatnonzero(plain)] = _exact_ns(numbers, required=required)
    for index in np.flatnonzero(~np.array(plain, dtype=bool)).tolist():
        out[index] = _one_ns(values[index], required=required)
    return out


_PLAIN_NUMBER = re.compile(rb"[0-9]+(?:\.[0-9]+)?")


def _one_ns(value: msgspec.Raw, *, required: bool) -> int:
    raw = bytes(value)
    if not raw:
        if required:
            raise StructMismatch("an event without ts")
        return 0
    return _decimal_ns(raw)


def _decimal_ns(raw: bytes) -> int:
    """A JSON number's text in µs -> ns, as the scanner reads it (``Decimal``, half to even)."""
    try:
        exact = Decimal(raw.decode("ascii")) * 1000
    except (UnicodeDecodeError, InvalidOperation) as exc:
        raise StructMismatch(f"a time that is not a number: {raw[:40]!r}") from exc
    if not exact.is_finite() or raw.startswith((b"t", b"f", b"n", b'"')):
        raise StructMismatch(f"a time that is not a number: {raw[:40]!r}")
    value = int(exact.to_integral_value(ROUND_HALF_EVEN))
    if not -_INT64_MAX <= value <= _INT64_MAX:
        raise StructMismatch("a time beyond int64")
    return value


def _ranges(
    rows: npt.NDArray[np.bool_],
    kind: npt.NDArray[np.int8],
    pid: npt.NDArray[np.int64],
    tid: npt.NDArray[np.int64],
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    name_ids: npt.NDArray[np.int32],
    sink: StructSink,
) -> None:
    if not rows.any():
        return
    _require_ids(pid[rows], tid[rows])
    out = np.empty(int(rows.sum()), dtype=RANGE_DTYPE)
    out["kind"] = kind[rows]
    out["rank"] = -1
    out["process"] = pid[rows]
    out["thread"] = tid[rows]
    out["start"] = start[rows]
    out["end"] = end[rows]
    out["name"] = name_ids[rows]
    out["parent"] = -1
    out["depth"] = 0
    sink.emit("ranges", out)


def _launches(
    rows: npt.NDArray[np.bool_],
    chosen: list[_Event],
    pid: npt.NDArray[np.int64],
    tid: npt.NDArray[np.int64],
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    name_ids: npt.NDArray[np.int32],
    sink: StructSink,
) -> None:
    if not rows.any():
        return
    _require_ids(pid[rows], tid[rows])
    where = np.flatnonzero(rows).tolist()
    out = np.empty(len(where), dtype=LAUNCH_DTYPE)
    out["rank"] = -1
    out["process"] = pid[rows]
    out["thread"] = tid[rows]
    out["start"] = start[rows]
    out["end"] = end[rows]
    out["correlation"] = _column([chosen[i].args.correlation for i in where])  # type: ignore[union-attr]
    out["api"] = name_ids[rows]
    out["sync"] = False  # set from the API names once the file is read
    sink.emit("launches", out)


def _activities(
    rows: npt.NDArray[np.bool_],
    chosen: list[_Event],
    kind: npt.NDArray[np.int8],
    pid: npt.NDArray[np.int64],
    tid: npt.NDArray[np.int64],
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    name_ids: npt.NDArray[np.int32],
    sink: StructSink,
) -> None:
    """Kernels, memcpy, memset (``kineto._activity``): device and stream from ``args``, else
    the event's pid and tid."""
    if not rows.any():
        return
    where = np.flatnonzero(rows).tolist()
    args = [_NO_ARGS if (a := chosen[i].args) is None else a for i in where]
    device = _column([a.device for a in args], pid[rows])
    if (device == _MISSING_ID).any():
        raise StructMismatch("a GPU activity without a device or pid")
    threads = tid[rows]
    stream = _column([a.stream for a in args], np.where(threads == _MISSING_ID, -1, threads))
    if (device < _INT16[0]).any() or (device > _INT16[1]).any():
        raise StructMismatch("a device index beyond int16")
    out = np.empty(len(where), dtype=ACTIVITY_DTYPE)
    out["kind"] = kind[rows]
    out["rank"] = -1
    out["process"] = -1  # filled from the launch that owns the correlation id
    out["device"] = device
    out["stream"] = stream
    out["start"] = start[rows]
    out["end"] = end[rows]
    out["name"] = name_ids[rows]
    out["correlation"] = _column([a.correlation for a in args])
    out["graph_node"] = _column([a.graph_node for a in args])
    size = _column([a.size for a in args])
    out["bytes"] = np.where(kind[rows] == ActivityKind.KERNEL, -1, size)
    sink.emit("activities", out)


def _column(
    values: list[int | msgspec.UnsetType | None], default: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.int64]:
    """An int64 column of ``args`` values: absent ones from ``default`` (else -1)."""
    try:
        # none absent (the common case); the values are ints by their struct type, never
        # texts numpy would parse
        return np.array(values, dtype=np.int64)
    except TypeError:  # an absent one (``UNSET``), or a ``null``
        pass
    except OverflowError as exc:
        raise StructMismatch(f"an args value beyond int64 ({exc})") from exc
    try:
        out = np.fromiter((-1 if v is _UNSET else v for v in values), np.int64, len(values))
    except (TypeError, ValueError, OverflowError) as exc:
        raise StructMismatch(f"an args value that is not an int64 ({exc})") from exc
    if default is not None:
        absent = np.fromiter((v is _UNSET for v in values), bool, len(values))
        out[absent] = default[absent]
    return out


def _require_ids(pid: npt.NDArray[np.int64], tid: npt.NDArray[np.int64]) -> None:
    if (pid == _MISSING_ID).any() or (tid == _MISSING_ID).any():
        raise StructMismatch("a range or launch without pid or tid")


def _external(args: _Args | None) -> int:
    """A GPU annotation's ``External id`` when it is an integer, else -1."""
    raw = bytes(args.external) if args is not None else b""
    value = orjson.loads(raw) if raw else -1
    return int(value) if isinstance(value, int) else -1


def _metadata(event: _Event, sink: StructSink) -> None:
    """``thread_name`` metadata: the thread's name (``kineto._metadata_event``)."""
    if event.name != "thread_name" or event.args is None or not isinstance(event.tid, int):
        return
    raw = bytes(event.args.name)
    value = orjson.loads(raw) if raw else None
    if isinstance(value, str):
        sink.thread_names[event.tid] = value
