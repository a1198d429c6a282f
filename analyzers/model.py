"""The normalized trace model that every reader produces and every analysis consumes.

Why columnar: a multi-GB trace has tens of millions of events; one Python object per event costs
~100x the memory of a numpy row. Readers append rows to growable column buffers (``TableBuilder``)
and freeze them into numpy structured arrays; names are interned once in a ``SymbolTable`` so the
arrays hold small integer ids, never strings.

Both nsys and Kineto traces map onto the same three tables:

========== ====================================================================================
table      one row per
========== ====================================================================================
activities GPU activity: kernel, memcpy or memset (a CUDA-graph launch yields many rows that
           share one correlation id)
launches   CPU-side launch call: cudaLaunchKernel(ExC), cuLaunchKernel(Ex), cudaGraphLaunch,
           cudaMemcpyAsync, cudaMemsetAsync, ... (the runtime/driver API row that owns the
           correlation id)
ranges     annotation range on a CPU thread: NVTX push/pop or start/end, ``record_function``
           (Kineto ``user_annotation``), Python function frames, and step markers
           (``ProfilerStep#N``)
========== ====================================================================================

Timestamps are integer nanoseconds on one clock per trace (the trace's own). ``process`` is an
integer process key (nsys ``globalPid``; Kineto ``pid``); ``thread`` is an integer thread key
(nsys ``globalTid``; Kineto ``tid``), unique within the trace. ``rank`` is the distributed rank
the process belongs to, -1 when unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt


class ActivityKind(IntEnum):
    """What a GPU activity row is."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2


class RangeKind(IntEnum):
    """Where an annotation range came from; attribution prefers some kinds over others."""

    NVTX = 0
    RECORD_FUNCTION = 1  # Kineto cpu "user_annotation" (torch.profiler.record_function)
    PYTHON = 2  # Python function frame (Kineto python_function, nsys --python-functions-trace)
    STEP = 3  # ProfilerStep#N and other step markers
    CPU_OP = 4  # aten operator (Kineto cpu_op)


ACTIVITY_DTYPE = np.dtype(
    [
        ("kind", np.int8),  # ActivityKind
        ("rank", np.int16),
        ("process", np.int64),
        ("device", np.int16),
        ("stream", np.int64),
        ("start", np.int64),
        ("end", np.int64),
        ("name", np.int32),  # SymbolTable id
        ("correlation", np.int64),  # -1 when the trace has none for this row
        ("graph_node", np.int64),  # CUDA graph node id, -1 when not launched from a graph
        ("bytes", np.int64),  # bytes a memcpy/memset moved or set; -1 for kernels and unknown
    ]
)

LAUNCH_DTYPE = np.dtype(
    [
        ("rank", np.int16),
        ("process", np.int64),
        ("thread", np.int64),
        ("start", np.int64),
        ("end", np.int64),
        ("correlation", np.int64),
        ("api", np.int32),  # SymbolTable id of the API name, e.g. "cudaLaunchKernel"
        # True for a host-synchronising call (cudaStreamSynchronize, cuCtxSynchronize, ...):
        # kept so the step account sees the host wait, never counted as a launch
        ("sync", np.bool_),
    ]
)
"""Rows of ``Trace.launches``: the CPU calls that launch GPU work (kernels, memcpy, memset,
graphs), which own the correlation id of that work, and the host-synchronising calls
(``sync`` True, no GPU work of their own). "launches" in every figure counts only the former:
use ``launch_calls``."""

RANGE_DTYPE = np.dtype(
    [
        ("kind", np.int8),  # RangeKind
        ("rank", np.int16),
        ("process", np.int64),
        ("thread", np.int64),
        ("start", np.int64),
        ("end", np.int64),  # ranges still open at the end of the capture end at the trace end
        ("name", np.int32),  # SymbolTable id
        ("parent", np.int64),  # row index of the enclosing range on the same thread, -1 if none
        ("depth", np.int16),  # nesting depth on its thread, 0 for outermost
    ]
)

GPU_RANGE_DTYPE = np.dtype(
    [
        ("rank", np.int16),
        ("device", np.int16),
        ("stream", np.int64),
        ("start", np.int64),
        ("end", np.int64),
        ("name", np.int32),  # SymbolTable id: the CPU range's name it mirrors
        ("external", np.int64),  # the CPU range's Kineto "External id", -1 when absent
    ]
)
"""GPU-side mirror of a CPU annotation (Kineto ``gpu_user_annotation``): from the first to the
last GPU activity the range launched, one row per stream. Not a CPU range, so kept apart."""


MAX_NAME_CHARS = 4096
"""Longest kernel or range name kept; longer ones are cut with ``truncated_name``'s marker."""


def launch_calls(launches: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Which rows of a ``launches`` table are CPU launch calls (not synchronising calls)."""
    out: npt.NDArray[np.bool_] = ~launches["sync"]
    return out


def truncated_name(name: str, limit: int = MAX_NAME_CHARS) -> str:
    """``name`` cut to at most ``limit`` characters, its full length in the marker.

    A hostile trace can carry a 10 MB kernel name; every report, page and JSON twin would copy
    it. The marker keeps the cut visible and the result stays within the cap, so truncating a
    truncated name changes nothing (tables are merged by re-interning).
    """
    if len(name) <= limit:
        return name
    marker = f"...[truncated: {len(name)} chars]"
    return name[: max(limit - len(marker), 0)] + marker


class SymbolTable:
    """Interns strings to dense integer ids so event tables hold ints, not strings.

    Names longer than ``MAX_NAME_CHARS`` are stored truncated (``truncated_name``); their full
    length is in the marker and in ``full_lengths``.
    """

    __slots__ = ("_ids", "full_lengths", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.full_lengths: dict[int, int] = {}

    def intern(self, name: str) -> int:
        """Return the id of ``name``, adding it on first sight."""
        found = self._ids.get(name)
        if found is not None:
            return found
        if len(name) > MAX_NAME_CHARS:
            return self._intern_long(name)
        new_id = len(self.names)
        self.names.append(name)
        self._ids[name] = new_id
        return new_id

    def _intern_long(self, name: str) -> int:
        short = truncated_name(name)
        found = self._ids.get(short)
        if found is None:
            found = len(self.names)
            self.names.append(short)
            self._ids[short] = found
            self.full_lengths[found] = len(name)
        return found

    @classmethod
    def from_names(cls, names: list[str], full_lengths: dict[int, int]) -> SymbolTable:
        """A table holding ``names`` at their ids (as stored from another table's ``names``
        and ``full_lengths``: truncated names stay truncated, never re-interned)."""
        table = cls()
        table.names = list(names)
        table._ids = {name: i for i, name in enumerate(table.names)}
        table.full_lengths = dict(full_lengths)
        return table

    def lookup(self, name: str) -> int | None:
        """Return the id of ``name`` or None when it never occurred."""
        return self._ids.get(truncated_name(name))

    def __getitem__(self, symbol_id: int) -> str:
        return self.names[symbol_id]

    def __len__(self) -> int:
        return len(self.names)


class TableBuilder:
    """Append-only column buffer that grows geometrically and freezes into a structured array.

    Readers add rows in chunks (``extend``) or one at a time (``append``); either way memory is
    one numpy row per event, not one Python object.
    """

    __slots__ = ("_buf", "_size", "dtype")

    def __init__(self, dtype: np.dtype, capacity: int = 4096) -> None:
        self.dtype = dtype
        self._buf = np.empty(capacity, dtype=dtype)
        self._size = 0

    def _reserve(self, extra: int) -> None:
        need = self._size + extra
        if need <= len(self._buf):
            return
        capacity = max(need, 2 * len(self._buf))
        grown = np.empty(capacity, dtype=self.dtype)
        grown[: self._size] = self._buf[: self._size]
        self._buf = grown

    def append(self, row: tuple[object, ...]) -> None:
        """Add one row given as a tuple in dtype field order."""
        self._reserve(1)
        self._buf[self._size] = row
        self._size += 1

    def extend(self, rows: npt.NDArray[np.void] | Sequence[tuple[object, ...]]) -> None:
        """Add many rows: a structured array of this dtype, or a sequence of tuples."""
        if not isinstance(rows, np.ndarray):
            rows = np.array(list(rows), dtype=self.dtype)
        self._reserve(len(rows))
        self._buf[self._size : self._size + len(rows)] = rows
        self._size += len(rows)

    def __len__(self) -> int:
        return self._size

    def freeze(self) -> npt.NDArray[np.void]:
        """Return the rows as a compact array; the builder must not be used afterwards."""
        return self._buf[: self._size].copy()


@dataclass(kw_only=True, slots=True)
class Trace:
    """One normalized trace: all ranks one source file covers.

    An nsys export of a multi-process run covers several ranks in one ``Trace``; a Kineto file
    covers one rank. ``merge_traces`` concatenates per-rank traces into one.
    """

    source: str
    """Path (or label) of the file the trace came from; several joined by ';' after a merge."""
    format: str
    """'nsys' or 'kineto'."""
    strings: SymbolTable
    activities: npt.NDArray[np.void]
    launches: npt.NDArray[np.void]
    ranges: npt.NDArray[np.void]
    ranks: dict[int, int] = field(default_factory=dict)
    """process key -> distributed rank."""
    thread_names: dict[int, str] = field(default_factory=dict)
    """thread key -> thread name, where the trace records one."""
    span: tuple[int, int] = (0, 0)
    """(first, last) timestamp in ns over every table."""
    notes: list[str] = field(default_factory=list)
    """Analyses this trace cannot support and why (a missing table, a column an old nsys lacks)."""
    metadata: dict[str, object] = field(default_factory=dict)
    """Reader facts: nsys version, Kineto distributedInfo, device names, ..."""
    gpu_ranges: npt.NDArray[np.void] = field(
        default_factory=lambda: np.empty(0, dtype=GPU_RANGE_DTYPE)
    )
    """GPU annotations (``GPU_RANGE_DTYPE``); empty for readers that have none (nsys)."""

    def name_of(self, symbol_id: int) -> str:
        """Return the string behind a SymbolTable id."""
        return self.strings[symbol_id]

    def rank_list(self) -> list[int]:
        """Ranks present in the trace, sorted."""
        present: set[int] = set()
        for table in (self.activities, self.launches, self.ranges):
            if len(table):
                present.update(int(r) for r in np.unique(table["rank"]))
        return sorted(present)


_TABLE_DTYPES = {
    "activities": ACTIVITY_DTYPE,
    "launches": LAUNCH_DTYPE,
    "ranges": RANGE_DTYPE,
    "gpu_ranges": GPU_RANGE_DTYPE,
}


def adopt_dtypes(trace: Trace) -> Trace:
    """``trace`` with its tables viewed as this module's own dtype objects (no copy).

    Why: a trace that crossed a process boundary (a read worker returns it pickled) holds equal
    copies of the dtypes, and so does every column taken from them; numpy's fast loops for
    ``np.add.at`` and ``np.maximum.at`` recognise int64 by identity and fall back to a generic
    loop ~30x slower on such columns (measured: 0.185 s instead of 0.005 s for 2M rows).
    """
    for name, dtype in _TABLE_DTYPES.items():
        table = getattr(trace, name)
        if table.dtype is not dtype and table.dtype == dtype:
            setattr(trace, name, table.view(dtype))
    return trace


def remap_symbols(target: SymbolTable, source: SymbolTable) -> npt.NDArray[np.int32]:
    """Return an array that maps ``source`` ids to ``target`` ids, interning as needed."""
    return np.fromiter((target.intern(n) for n in source.names), dtype=np.int32, count=len(source))


TableRows = tuple[int, int, int, int]
"""Rows of a trace's activities, launches, ranges and gpu_ranges (``table_rows``)."""


def table_rows(trace: Trace) -> TableRows:
    """The row counts ``merge_traces`` needs up front to merge a stream of traces."""
    return (len(trace.activities), len(trace.launches), len(trace.ranges), len(trace.gpu_ranges))


def merge_traces(traces: Iterable[Trace], rows: Sequence[TableRows] | None = None) -> Trace:
    """Concatenate traces (typically one Kineto file per rank) into one with a shared table.

    Process and thread keys of different files can collide (two ranks may both be pid 0 on
    different hosts), so each input's keys are offset into a disjoint range.

    With ``rows`` (each trace's ``table_rows``, in order) ``traces`` may be a generator: each
    trace is copied into the merged tables, which are allocated once, and let go before the
    next one is made, so the merge holds the merged tables and one input (the per-rank merge,
    ``analyzers.rank_parts``, loads its parts so), not every input and its copies.
    """
    if rows is None:
        items = list(traces)
        rows = [table_rows(t) for t in items]
        traces = items
    if len(rows) == 1:
        (only,) = traces
        return only
    names = ("activities", "launches", "ranges", "gpu_ranges")
    out = {
        name: np.empty(sum(r[i] for r in rows), dtype=_TABLE_DTYPES[name])
        for i, name in enumerate(names)
    }
    at = [0, 0, 0, 0]
    strings = SymbolTable()
    ranks: dict[int, int] = {}
    thread_names: dict[int, str] = {}
    notes: list[str] = []
    parts: list[object] = []
    sources: list[str] = []
    formats: set[str] = set()
    starts: list[int] = []
    ends: list[int] = []
    index = -1
    for trace in traces:  # not enumerate(): its cached result tuple would hold the last one
        index += 1
        if table_rows(trace) != tuple(rows[index]):
            raise ValueError(f"{trace.source}: table rows {table_rows(trace)}, told {rows[index]}")
        key_offset = index << 48
        mapping = remap_symbols(strings, trace.strings)
        tables = {name: getattr(trace, name) for name in names}
        views: dict[str, npt.NDArray[np.void]] = {}
        for i, name in enumerate(names):
            views[name] = out[name][at[i] : at[i] + rows[index][i]]
            views[name][...] = tables[name]
            at[i] += rows[index][i]
        a, l_, r, g = (views[name] for name in names)
        a["name"] = mapping[a["name"]]
        a["process"] += key_offset
        l_["api"] = mapping[l_["api"]]
        l_["process"] += key_offset
        l_["thread"] += key_offset
        r["name"] = mapping[r["name"]]
        r["process"] += key_offset
        r["thread"] += key_offset
        range_offset = at[2] - len(r)
        r["parent"] = np.where(r["parent"] >= 0, r["parent"] + range_offset, -1)
        g["name"] = mapping[g["name"]]
        ranks.update({p + key_offset: rk for p, rk in trace.ranks.items()})
        thread_names.update({t + key_offset: n for t, n in trace.thread_names.items()})
        notes.extend(trace.notes)
        parts.append({"source": trace.source, **trace.metadata})
        sources.append(trace.source)
        formats.add(trace.format)
        starts.append(trace.span[0])
        ends.append(trace.span[1])
        del trace, tables
    if index + 1 != len(rows):
        raise ValueError(f"{index + 1} traces, told {len(rows)}")
    return Trace(
        source=";".join(sources),
        format=formats.pop() if len(formats) == 1 else "mixed",
        strings=strings,
        activities=out["activities"],
        launches=out["launches"],
        ranges=out["ranges"],
        ranks=ranks,
        thread_names=thread_names,
        span=(min(starts), max(ends)),
        notes=notes,
        metadata={"parts": parts},
        gpu_ranges=out["gpu_ranges"],
    )
