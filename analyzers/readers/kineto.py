"""Read a PyTorch profiler (Kineto) Chrome-trace JSON file (``.json``, ``.json.gz``).

One file is one rank. Event mapping (only complete events, ``ph == "X"``):

=========================== ================================================================
Kineto ``cat``              normalized rows
=========================== ================================================================
kernel, gpu_memcpy,         activities: device = args.device, stream = args.stream,
gpu_memset                  correlation = args.correlation; process = the CPU process whose
                            launch owns the correlation id (Kineto writes the device as pid)
cuda_runtime, cuda_driver   launches: launch calls with a correlation id, and host syncs
                            (``cudaStreamSynchronize`` ..., ``sync`` True: not launches)
user_annotation             ranges RECORD_FUNCTION (``ProfilerStep#N``: STEP)
python_function             ranges PYTHON (parent/depth from time among Python frames; the
                            tree equals Kineto's "Python parent id" links, so those are not
                            stored separately)
cpu_op                      ranges CPU_OP (cpu_op, user_annotation and steps nest with each
                            other, Python frames with each other: two families per thread)
gpu_user_annotation         gpu_ranges (GPU-side mirror of a CPU annotation, not a CPU range:
                            the timeline measures a step's GPU time over it)
=========================== ================================================================

Timestamps are microseconds; they become integer ns exactly, from their decimal text, never
through a float: an integer, or up to three decimals, is exact; more decimals round half to even
at the nanosecond (``_ns``). The struct and layout paths read the digits themselves; the scanner
parses numbers as ``Decimal``. Only a ``ts`` the layout reader could not cut out of its line
(an exponent, a sign) arrives as a float; it is read through its shortest decimal form.

Four paths give the same rows. ``_kineto_structs`` decodes whole events of any JSON layout
with ``msgspec`` into typed structs and builds the columns with numpy; it reads clean traces
only and gives up (``StructMismatch``) on anything the others decide specially (a string pid,
a ``null`` time, an event that is not an object, malformed JSON). Then ``_kineto_layout`` cuts
the range events out of Kineto's fixed line layout with numpy; a file in any other JSON layout
is read by ``_json_chunks``, which finds the events' keys from the string delimiters of a chunk
and vectorizes the range events the same way; and malformed JSON ends in the streaming scanner
``_json_stream``, which reports the exact position of the error. The layout reader hands over
early (after its first chunk); the struct path gives up at the first chunk it cannot read.

The rank comes from the ``rank`` argument, else ``distributedInfo.rank``, else ``rank<N>`` in
the file name, else it is -1 with ``metadata["rank_source"] == "unknown"``: ``read_trace`` and
``read_trace_files`` then make a lone file rank 0 (with a note) and refuse several such files,
since a trace set whose ranks are guessed would compare the wrong ranks (``_ranks``).
"""

from __future__ import annotations

import codecs
import functools
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from analyzers.errors import CorruptTraceError
from analyzers.model import (
    ACTIVITY_DTYPE,
    GPU_RANGE_DTYPE,
    LAUNCH_DTYPE,
    RANGE_DTYPE,
    ActivityKind,
    RangeKind,
    SymbolTable,
    Trace,
    adopt_dtypes,
    launch_calls,
)
from analyzers.readers._cuda_api import is_kept_api, sync_column
from analyzers.readers._files import DEFAULT_MAX_DECOMPRESSED, file_blocks
from analyzers.readers._json_chunks import ChunkMismatch, read_chunks
from analyzers.readers._json_stream import iter_events
from analyzers.readers._kineto_layout import (
    ExactNs,
    LayoutMismatch,
    RowSink,
    read_layout,
)
from analyzers.readers._kineto_structs import StructMismatch, StructSink, read_structs
from analyzers.readers._labels import python_frame_label, relabel
from analyzers.readers._nesting import nest
from analyzers.readers._ranks import UNKNOWN

ACTIVITY_CATS = {
    "kernel": ActivityKind.KERNEL,
    "gpu_memcpy": ActivityKind.MEMCPY,
    "memcpy": ActivityKind.MEMCPY,
    "gpu_memset": ActivityKind.MEMSET,
    "memset": ActivityKind.MEMSET,
}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
RANGE_CATS = {
    "user_annotation": RangeKind.RECORD_FUNCTION,
    "python_function": RangeKind.PYTHON,
    "python": RangeKind.PYTHON,
    "cpu_op": RangeKind.CPU_OP,
    "operator": RangeKind.CPU_OP,
}
_DTYPES = {"activities": ACTIVITY_DTYPE, "launches": LAUNCH_DTYPE, "ranges": RANGE_DTYPE}
STEP_NAME = re.compile(r"^ProfilerStep#\d+$")
RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
FLUSH_ROWS = 1 << 16
"""Rows gathered as tuples before they are packed into numpy (bounds Python-object memory)."""
STRUCTS_PATH = True
"""Try the typed-struct decode first; tests switch it off to compare with the other paths."""
LAYOUT_FAST_PATH = True
"""Then Kineto's fixed layout; tests switch it off to compare with the other paths."""
CHUNKS_PATH = True
"""Then the any-layout chunked path; tests switch it off to compare with the scanner."""
WORKERS_ENV = "CPTRACE_READ_WORKERS"
"""Worker processes ``read_kineto_files`` may fork (default 1: none). Measured on the 2-core
CI machine under load, two workers were not faster and took 1.5x the memory (the traces come
back pickled), see ``benchmarks/hta_compare.py``; on an idle multi-core host they can be."""


@dataclass(slots=True)
class _Tables:
    """Column builders plus the per-file facts collected while streaming."""

    strings: SymbolTable = field(default_factory=SymbolTable)
    blocks: dict[str, list[npt.NDArray[np.void]]] = field(
        default_factory=lambda: {"activities": [], "launches": [], "ranges": []}
    )
    """Finished rows per table as a list of arrays: concatenated once at the end, so the peak
    is twice the table, not the three times of a doubling buffer plus its final copy."""
    pending: dict[str, list[tuple[object, ...]]] = field(
        default_factory=lambda: {"activities": [], "launches": [], "ranges": []}
    )
    thread_names: dict[int, str] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    launch_names: dict[str, bool] = field(default_factory=dict)
    drained: frozenset[str] = frozenset()
    """Tables whose pending rows the layout reader takes itself (never flushed by ``add``)."""
    step_ids: dict[int, bool] = field(default_factory=dict)
    gpu_ranges: list[tuple[object, ...]] = field(default_factory=list)
    """``gpu_user_annotation`` rows (``GPU_RANGE_DTYPE``): a few per step, never millions."""

    def add(self, table: str, row: tuple[object, ...]) -> None:
        rows = self.pending[table]
        rows.append(row)
        if len(rows) >= FLUSH_ROWS and table not in self.drained:
            self.flush(table)

    def flush(self, table: str) -> None:
        rows = self.pending[table]
        if rows:
            self.blocks[table].append(np.array(rows, dtype=_DTYPES[table]))
            rows.clear()

    def extend(self, table: str, rows: npt.NDArray[np.void]) -> None:
        self.blocks[table].append(rows)

    def count(self, table: str) -> int:
        return sum(len(b) for b in self.blocks[table]) + len(self.pending[table])

    def freeze(self, table: str) -> npt.NDArray[np.void]:
        """All rows of ``table`` in one array; the blocks are released."""
        self.flush(table)
        parts = self.blocks[table]
        out = np.concatenate(parts) if parts else np.empty(0, dtype=_DTYPES[table])
        parts.clear()
        return out

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def read_kineto(
    path: str | Path,
    *,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> Trace:
    """Read one Kineto trace file into the normalized model.

    Args:
        path: ``.json`` or ``.json.gz`` (detected from content).
        rank: override the rank (else ``distributedInfo.rank``, else ``rank<N>`` in the name,
            else -1: see the module docstring).
        max_decompressed_bytes: the cap of a ``.json.gz``'s expansion (``_files.inflated``).

    Raises:
        UnsupportedTraceError: JSON that is not a trace.
        CorruptTraceError: truncated or malformed file, or no events.
        TraceTooLargeError: the file expands past ``max_decompressed_bytes``.
    """
    source = Path(path)
    header, tables, parser = _read_any(source, max_decompressed_bytes)
    for name in ("activities", "launches", "ranges"):
        tables.flush(name)
    if not any(tables.count(t) for t in ("activities", "launches", "ranges")):
        raise CorruptTraceError(f"{source}: Kineto trace has no events (traceEvents is empty)")
    rank_found, rank_source = _rank(source, header, rank)
    trace = _finish(source, header, tables, rank_found)
    trace.metadata["json_parser"] = parser
    trace.metadata["rank_source"] = rank_source
    process_ranks = _process_ranks(header)
    if rank is None and process_ranks:
        set_process_ranks(trace, process_ranks)
        trace.metadata["rank_source"] = PROCESS_RANKS_SOURCE
    return trace


def _read_any(source: Path, cap: int) -> tuple[dict[str, object], _Tables, str]:
    """(header, rows, parser name): each path in turn, starting over when one cannot read the
    file (see the module docstring)."""
    header: dict[str, object] = {}
    tables = _Tables()
    try:
        if not STRUCTS_PATH:
            raise StructMismatch("struct path switched off")
        read_structs(file_blocks(source, cap), header, _struct_sink(tables))
        return header, tables, "msgspec-structs"
    except StructMismatch:
        header, tables = {}, _Tables()
    try:
        if not LAYOUT_FAST_PATH:
            raise LayoutMismatch("fast path switched off")
        read_layout(file_blocks(source, cap), header, _sink(tables))
        return header, tables, "kineto-layout"
    except LayoutMismatch:
        # Not Kineto's own layout: start over, cutting whole events out of any JSON layout.
        header, tables = {}, _Tables()
    try:
        if not CHUNKS_PATH:
            raise ChunkMismatch("chunked path switched off")
        read_chunks(file_blocks(source, cap), header, _sink(tables))
        return header, tables, "json-chunks"
    except (ChunkMismatch, LayoutMismatch):
        # Malformed (or not a trace): the streaming scanner names the exact position of a
        # syntax error, or reads what the chunked path could not.
        header, tables = {}, _Tables()
    with _open_text(source, cap) as stream:
        for event in iter_events(stream, str(source), header):
            _take(event, tables)
    return header, tables, "json-scanner"


PROCESS_RANKS_SOURCE = "otherData.cptrace.process_ranks"
"""``rank_source`` of a cptrace export holding several ranks in one file."""


def _process_ranks(header: dict[str, object]) -> dict[int, int]:
    """CPU process -> rank, as ``cptrace export perfetto`` writes it (empty for other files)."""
    other = header.get("otherData")
    ours = other.get("cptrace") if isinstance(other, dict) else None
    table = ours.get("process_ranks") if isinstance(ours, dict) else None
    if not isinstance(table, dict):
        return {}
    try:
        return {int(p): int(r) for p, r in table.items()}
    except (TypeError, ValueError):
        return {}


def set_process_ranks(trace: Trace, process_ranks: dict[int, int]) -> None:
    """Give every row the rank of its process; activities take their launching process's.

    Affects: the ``rank`` column of every table and ``trace.ranks``. Rows of a process the map
    does not name keep the file's rank.
    """
    for table in (trace.activities, trace.launches, trace.ranges):
        if len(table) == 0:
            continue
        processes = np.unique(table["process"]).tolist()
        for p in processes:
            if p in process_ranks:
                table["rank"][table["process"] == p] = process_ranks[p]
    trace.ranks = {p: process_ranks.get(p, r) for p, r in trace.ranks.items()}


def read_kineto_files(
    paths: Sequence[str | Path], *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED
) -> list[Trace]:
    """Read several Kineto files (one per rank); in forked workers if ``WORKERS_ENV`` asks.

    A worker returns its ``Trace`` pickled: numpy arrays and a string table, a few MB per rank,
    so the parent pays little for the parallelism. Workers are forked (no re-import), and only
    from a single-threaded process: forking a process whose other threads hold locks (a web
    server's worker threads) can deadlock the child, so such callers read one file at a time.

    Raises:
        The first error of ``read_kineto`` among the files, as ``read_kineto`` raises it.
    """
    items = [Path(p) for p in paths]
    read = functools.partial(read_kineto, max_decompressed_bytes=max_decompressed_bytes)
    workers = _workers(len(items))
    if workers <= 1:
        return [read(p) for p in items]
    import multiprocessing  # only here: most reads are one file

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [adopt_dtypes(t) for t in pool.map(read, items, chunksize=1)]


def _workers(files: int) -> int:
    raw = os.environ.get(WORKERS_ENV)
    try:
        limit = int(raw) if raw is not None else 1
    except ValueError as exc:
        raise ValueError(f"{WORKERS_ENV}={raw!r}: expected an integer number of processes") from exc
    if min(files, limit) <= 1:  # the common case: no pool, so no multiprocessing import
        return 1
    import multiprocessing

    if (
        threading.active_count() > 1
        or multiprocessing.current_process().daemon  # a pool worker cannot fork its own
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return 1
    return max(1, min(files, limit))


def _sink(tables: _Tables) -> RowSink:
    """Where the vectorized readers put their rows (and hand every other event)."""
    tables.drained = frozenset(("ranges", "launches"))  # merged per chunk, in file order
    return RowSink(
        strings=tables.strings,
        take=lambda event: _take(event, tables),
        pending=tables.pending,
        emit=lambda table, rows: _emit(table, rows, tables),
        keeps_api=lambda name: _keeps_api(name, tables),
    )


def _struct_sink(tables: _Tables) -> StructSink:
    """Where the struct path puts its rows."""
    return StructSink(
        strings=tables.strings,
        keeps_api=lambda name: _keeps_api(name, tables),
        emit=lambda table, rows: _emit(table, rows, tables),
        gpu_ranges=tables.gpu_ranges,
        thread_names=tables.thread_names,
    )


def _emit(table: str, rows: npt.NDArray[np.void], tables: _Tables) -> None:
    """Take a block of rows in file order; RecordFunction ranges named like steps are steps."""
    if table == "ranges":
        steps = rows["kind"] == _RECORD_FUNCTION
        if steps.any():
            steps[steps] = [_is_step(int(i), tables) for i in rows["name"][steps]]
            rows["kind"][steps] = _STEP
    tables.extend(table, rows)


def _keeps_api(name: str, tables: _Tables) -> bool:
    found = tables.launch_names.get(name)
    if found is None:  # a handful of API names repeat over millions of calls
        found = tables.launch_names[name] = is_kept_api(name)
    return found


def _is_step(name_id: int, tables: _Tables) -> bool:
    found = tables.step_ids.get(name_id)
    if found is None:
        found = tables.step_ids[name_id] = bool(STEP_NAME.match(tables.strings[name_id]))
    return found


class _BlockText:
    """``read(n)`` text over the capped decompressed blocks, for the streaming scanner."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._text = ""
        self._pos = 0
        self._decoded = 0  # bytes decoded before the current text, for error positions

    def read(self, size: int) -> str:
        while self._pos >= len(self._text):
            block = next(self._blocks, None)
            try:
                text = self._decoder.decode(block or b"", final=block is None)
            except UnicodeDecodeError as exc:
                exc.start += self._decoded
                raise
            self._decoded += len(block or b"")
            self._text, self._pos = text, 0
            if block is None and not text:
                return ""
        out = self._text[self._pos : self._pos + size]
        self._pos += size
        return out


@contextmanager
def _open_text(path: Path, cap: int) -> Iterator[TextIO]:
    """Text stream over the file, gunzipped by content; decoding errors name the file."""
    try:
        yield _BlockText(file_blocks(path, cap))  # type: ignore[misc]
    except UnicodeDecodeError as exc:
        raise CorruptTraceError(f"{path}: not UTF-8 text at byte {exc.start} ({exc})") from exc


def _ns(value: object) -> int:
    """Kineto µs (int, ``Decimal``, decimal text, or ``ExactNs``) -> exact integer ns."""
    if isinstance(value, ExactNs):
        return int(value)
    if isinstance(value, bool):
        raise TypeError("a boolean is not a time")
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        value = repr(value)  # the shortest decimal that reads back as this float
    if not isinstance(value, Decimal | str):
        raise TypeError(f"not a number: {value!r}")
    exact = Decimal(value) * 1000
    if not exact.is_finite():
        raise ValueError(f"not a finite time: {value!r}")
    return int(exact.to_integral_value(ROUND_HALF_EVEN))


def _take(event: object, tables: _Tables) -> None:
    """Route one event to its table; malformed events are counted, not fatal."""
    if not isinstance(event, dict):
        tables.skip("not an object")
        return
    phase = event.get("ph")
    if phase == "M":
        _metadata_event(event, tables)
        return
    if phase != "X":
        return
    cat = event.get("cat")
    route = _ROUTES.get(cat) if isinstance(cat, str) else None
    if route is None and isinstance(cat, str):
        route = _ROUTES.get(cat.lower())
    if route is None:
        if cat == "gpu_user_annotation":
            try:
                _gpu_annotation(event, tables)
            except (KeyError, TypeError, ValueError, OverflowError):
                tables.skip(f"{cat} event without numeric ts/dur/pid/tid")
        return
    handler, kind = route
    try:
        handler(event, kind, tables)
    except (KeyError, TypeError, ValueError, ArithmeticError):
        tables.skip(f"{cat} event without numeric ts/dur/pid/tid")


def _activity(event: dict[str, object], kind: int, tables: _Tables) -> None:
    args = event.get("args") or {}
    assert isinstance(args, dict)
    start = _ns(event["ts"])
    device = args.get("device", event.get("pid"))
    tables.add(
        "activities",
        (
            kind,
            -1,
            -1,  # process: filled from the launch that owns the correlation id
            int(device),
            int(args.get("stream", event.get("tid", -1))),
            start,
            start + _ns(event.get("dur", 0)),
            tables.strings.intern(str(event.get("name", ""))),
            int(args.get("correlation", -1)),
            int(args.get("graph node id", -1)),
            int(args.get("bytes", -1)) if kind != ActivityKind.KERNEL else -1,
        ),
    )


def _gpu_annotation(event: dict[str, object], tables: _Tables) -> None:
    args = event.get("args") or {}
    assert isinstance(args, dict)
    start = _ns(event["ts"])
    external = args.get("External id", -1)
    tables.gpu_ranges.append(
        (
            -1,
            int(event.get("pid", -1)),  # type: ignore[call-overload]
            int(event.get("tid", -1)),  # type: ignore[call-overload]
            start,
            start + _ns(event.get("dur", 0)),
            tables.strings.intern(str(event.get("name", ""))),
            int(external) if isinstance(external, int) else -1,
        )
    )


def _launch(event: dict[str, object], _kind: int, tables: _Tables) -> None:
    name = str(event.get("name", ""))
    args = event.get("args") or {}
    assert isinstance(args, dict)
    correlation = args.get("correlation")
    if correlation is None:
        return
    launch = tables.launch_names.get(name)
    if launch is None:  # a handful of API names repeat over millions of calls
        launch = tables.launch_names[name] = is_kept_api(name)
    if not launch:
        return
    start = _ns(event["ts"])
    tables.add(
        "launches",
        (
            -1,
            int(event["pid"]),  # type: ignore[call-overload]
            int(event["tid"]),  # type: ignore[call-overload]
            start,
            start + _ns(event.get("dur", 0)),
            int(correlation),
            tables.strings.intern(name),
            False,  # sync: set from the API names once the file is read
        ),
    )


def _range(event: dict[str, object], kind: int, tables: _Tables) -> None:
    # The hot path: Python frames are most of a with_stack trace, so no helper calls here.
    name = str(event.get("name", ""))
    if kind == _RECORD_FUNCTION and STEP_NAME.match(name):
        kind = _STEP
    start = _ns(event["ts"])
    tables.add(
        "ranges",
        (
            kind,
            -1,
            int(event["pid"]),  # type: ignore[call-overload]
            int(event["tid"]),  # type: ignore[call-overload]
            start,
            start + _ns(event.get("dur", 0)),
            tables.strings.intern(name),
            -1,
            0,
        ),
    )


def _metadata_event(event: dict[str, object], tables: _Tables) -> None:
    args = event.get("args")
    if event.get("name") == "thread_name" and isinstance(args, dict):
        tid = event.get("tid")
        if isinstance(tid, int) and isinstance(args.get("name"), str):
            tables.thread_names[tid] = str(args["name"])


def _rank(path: Path, header: dict[str, object], override: int | None) -> tuple[int, str]:
    """(rank, where it came from); rank -1 with source ``UNKNOWN`` when the file does not say
    (``resolve_ranks`` then decides: a lone file is rank 0, several are an error)."""
    if override is not None:
        return override, "rank argument"
    info = header.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"]), "distributedInfo.rank"
    found = RANK_IN_NAME.search(path.name)
    if found:
        return int(found.group(1)), "file name"
    return -1, UNKNOWN


def _finish(path: Path, header: dict[str, object], tables: _Tables, rank: int) -> Trace:
    activities = tables.freeze("activities")
    launches = tables.freeze("launches")
    launches["sync"] = sync_column(launches["api"], tables.strings)
    ranges = tables.freeze("ranges")
    frames = np.flatnonzero(ranges["kind"] == RangeKind.PYTHON)
    ranges["name"][frames] = relabel(ranges["name"][frames], tables.strings, python_frame_label)
    calls = launches[launch_calls(launches)]
    main_process = _main_process(calls, ranges)
    activities["process"] = _owning_process(activities, calls, main_process)
    # Python frames and RecordFunction ranges come from different tracers and straddle each
    # other (a record_function opens inside the __enter__ frame): nest them separately.
    family = (ranges["kind"] == RangeKind.PYTHON).astype(np.int64)
    ranges["parent"], ranges["depth"] = nest(
        ranges["thread"], ranges["start"], ranges["end"], family
    )
    gpu_ranges = np.array(tables.gpu_ranges, dtype=GPU_RANGE_DTYPE)
    for table in (activities, launches, ranges, gpu_ranges):
        table["rank"] = rank
    processes = {int(p) for t in (activities, launches, ranges) for p in np.unique(t["process"])}
    all_tables = [t for t in (activities, launches, ranges) if len(t)]
    return Trace(
        source=str(path),
        format="kineto",
        strings=tables.strings,
        activities=activities,
        launches=launches,
        ranges=ranges,
        ranks=dict.fromkeys(processes, rank),
        thread_names=tables.thread_names,
        span=(
            min(int(t["start"].min()) for t in all_tables),
            max(int(t["end"].max()) for t in all_tables),
        ),
        notes=_notes(launches),
        metadata=_metadata(header, tables),
        gpu_ranges=gpu_ranges,
    )


def _main_process(launches: npt.NDArray[np.void], ranges: npt.NDArray[np.void]) -> int:
    """The CPU process that issued most launches (else most ranges): owner of orphans."""
    for table in (launches, ranges):
        if len(table):
            values, counts = np.unique(table["process"], return_counts=True)
            return int(values[np.argmax(counts)])
    return -1


def _owning_process(
    activities: npt.NDArray[np.void], launches: npt.NDArray[np.void], fallback: int
) -> npt.NDArray[np.int64]:
    """Process of the launch with the same correlation id, else ``fallback``.

    Kineto writes the GPU index as an activity's pid; attribution matches processes the way it
    does for nsys, so activities take their launching CPU process instead.
    """
    out = np.full(len(activities), fallback, dtype=np.int64)
    if not len(launches) or not len(activities):
        return out
    order = np.argsort(launches["correlation"], kind="stable")
    keys = launches["correlation"][order]
    hit = np.searchsorted(keys, activities["correlation"])
    hit = np.minimum(hit, len(keys) - 1)
    found = keys[hit] == activities["correlation"]
    out[found] = launches["process"][order[hit[found]]]
    return out


def _notes(launches: npt.NDArray[np.void]) -> list[str]:
    if launch_calls(launches).any():
        return []
    return ["no cuda_runtime/cuda_driver launch events: range attribution unavailable"]


def _metadata(header: dict[str, object], tables: _Tables) -> dict[str, object]:
    devices = header.get("deviceProperties")
    names = (
        [str(d.get("name")) for d in devices if isinstance(d, dict)]
        if isinstance(devices, list)
        else []
    )
    keep = ("distributedInfo", "with_stack", "schemaVersion", "trace_id", "baseTimeNanoseconds")
    facts: dict[str, object] = {k: header[k] for k in keep if k in header}
    facts["device_names"] = names
    facts["skipped_events"] = dict(tables.skipped)
    return facts


_RECORD_FUNCTION, _STEP = int(RangeKind.RECORD_FUNCTION), int(RangeKind.STEP)
_Handler = Callable[[dict[str, object], int, _Tables], None]
_ROUTES: dict[str, tuple[_Handler, int]] = {
    **{cat: (_activity, int(kind)) for cat, kind in ACTIVITY_CATS.items()},
    **{cat: (_launch, -1) for cat in LAUNCH_CATS},
    **{cat: (_range, int(kind)) for cat, kind in RANGE_CATS.items()},
}
"""Kineto ``cat`` (lower case) -> (row builder, kind); other categories are not rows."""
