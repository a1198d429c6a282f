"""CUPTI kernel/memcpy/memset tables of an nsys export -> the ``activities`` array.

Most of a large export's read time is spent turning SQLite values into Python ints and those
into numpy, roughly per value. So the fast query packs small columns with SQL arithmetic
(``correlationId << 32 | name id``; ``globalPid | deviceId << 16 | streamId``, since a
globalPid's low 24 bits are zero): 5 values per row instead of 8, ``graphNodeId`` included
(reading it in the same pass is cheaper than probing the table for a non-NULL one first).
Guards turn any value that does not fit into NULL, and the plain query runs instead.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from analyzers.errors import CorruptTraceError
from analyzers.model import ACTIVITY_DTYPE, ActivityKind
from analyzers.readers._arrays import factorize
from analyzers.readers._nsys_sql import Columns, Fill, NsysSource, Query, shrink

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
TABLES = (
    (KERNEL, ActivityKind.KERNEL),
    (MEMCPY, ActivityKind.MEMCPY),
    (MEMSET, ActivityKind.MEMSET),
)
MEMCPY_LABELS = {
    1: "Host-to-Device",
    2: "Device-to-Host",
    8: "Device-to-Device",
    10: "Peer-to-Peer",
}
"""Fallback copy-kind labels when ENUM_CUDA_MEMCPY_OPER is missing."""

_U32 = "BETWEEN 0 AND 4294967295"
_LOW32 = np.int64(0xFFFFFFFF)


def read_activities(src: NsysSource) -> npt.NDArray[np.void]:
    """Kernels, memcpys and memsets written into one array (no concatenating copy)."""
    if not src.schema.has(KERNEL):
        src.notes.append(f"no {KERNEL} table: the capture recorded no kernels")
    present = [(table, kind) for table, kind in TABLES if src.schema.has(table)]
    for table, _ in TABLES[1:]:
        if not src.schema.has(table):
            absent = src.metadata.setdefault("absent_tables", [])
            assert isinstance(absent, list)
            absent.append(table)
    out = src.allocate([table for table, _ in present], ACTIVITY_DTYPE)
    filled = 0
    for table, kind in present:
        out, filled = _read_table(src, table, kind, out, filled)
    return shrink(out, filled)


def _read_table(
    src: NsysSource, table: str, kind: ActivityKind, out: npt.NDArray[np.void], filled: int
) -> tuple[npt.NDArray[np.void], int]:
    """Write the rows of one CUPTI activity table into ``out`` from row ``filled``."""
    missing = [c for c in ("start", "end", "correlationId") if not src.schema.has(table, c)]
    if missing:
        src.notes.append(f"{table} lacks column(s) {', '.join(missing)}: its rows are skipped")
        return out, filled
    label = {
        ActivityKind.KERNEL: _kernel_name_column(src),
        ActivityKind.MEMCPY: src.column(table, "copyKind", "0"),
        ActivityKind.MEMSET: "0",
    }[kind]
    if kind != ActivityKind.KERNEL and not src.schema.has(table, "bytes"):
        src.notes.append(f"{table} has no bytes column: its byte counts are unknown (-1)")
    first = filled
    out, filled = src.fetch_into(
        out, filled, table, [_packed(src, table, kind, label), _plain(src, table, kind, label)]
    )
    names = out["name"][first:filled]  # the label parks in "name" until interned here
    names[:] = _names(src, kind, names.astype(np.int64))
    return out, filled


def _packed(src: NsysSource, table: str, kind: ActivityKind, label: str) -> tuple[Query, Fill]:
    pid, device = src.column(table, "globalPid"), src.column(table, "deviceId")
    stream = src.column(table, "streamId")
    # graphNodeId is read with the rows even though it is usually NULL: probing for a non-NULL
    # value first scans the whole table when there is none (about twice the in-query cost).
    graph = src.schema.has(table, "graphNodeId")
    size = _bytes_column(src, table, kind)
    sql = (
        f'SELECT "start", "end", CASE WHEN "correlationId" {_U32} AND {label} {_U32}'
        f' THEN ("correlationId" << 32) | {label} END,'
        f" CASE WHEN {pid} & 16777215 = 0 AND {device} BETWEEN 0 AND 255"
        f" AND {stream} BETWEEN 0 AND 65535 THEN {pid} | ({device} << 16) | {stream} END"
        f"{', ' + src.column(table, 'graphNodeId') if graph else ''}"
        f"{', ' + size if size else ''} FROM {table}"
    )
    columns = (
        "start",
        "end",
        "corr_label",
        "where",
        *(("graph",) if graph else ()),
        *(("bytes",) if size else ()),
    )

    def fill(cols: Columns, rows: npt.NDArray[np.void]) -> None:
        rows["kind"], rows["rank"] = kind, -1
        rows["start"], rows["end"] = cols["start"], cols["end"]
        rows["correlation"] = (cols["corr_label"] >> 32) & _LOW32
        label = cols["corr_label"] & _LOW32
        _check_labels(src, table, label)
        rows["name"] = label
        where = cols["where"]
        rows["process"] = where & ~np.int64(0xFFFFFF)
        rows["device"] = (where >> 16) & 0xFF
        rows["stream"] = where & 0xFFFF
        rows["graph_node"] = cols["graph"] if graph else -1
        rows["bytes"] = cols["bytes"] if size else -1

    return Query(sql, columns, packed=True, splits=True), fill


def _plain(src: NsysSource, table: str, kind: ActivityKind, label: str) -> tuple[Query, Fill]:
    size = _bytes_column(src, table, kind) or "-1"
    sql = (
        f'SELECT "start", "end", {src.column(table, "deviceId")}, {src.column(table, "streamId")},'
        f' "correlationId", {src.column(table, "globalPid")}, {label},'
        f" {src.column(table, 'graphNodeId')}, {size} FROM {table}"
    )
    columns = (
        "start",
        "end",
        "device",
        "stream",
        "correlation",
        "process",
        "label",
        "graph",
        "bytes",
    )

    def fill(cols: Columns, rows: npt.NDArray[np.void]) -> None:
        rows["kind"], rows["rank"] = kind, -1
        for name in ("start", "end", "device", "stream", "correlation", "process"):
            rows[name] = cols[name]
        rows["graph_node"] = cols["graph"]
        rows["bytes"] = cols["bytes"]
        _check_labels(src, table, cols["label"])
        rows["name"] = cols["label"]

    return Query(sql, columns, splits=True), fill


def _bytes_column(src: NsysSource, table: str, kind: ActivityKind) -> str | None:
    """The ``bytes`` column of a memcpy/memset table (NULL -> -1); None for kernels, which move
    no bytes of their own, and for an export without the column (``_read_table`` notes it)."""
    if kind == ActivityKind.KERNEL:
        return None
    if not src.schema.has(table, "bytes"):
        return None
    return 'ifnull("bytes", -1)'


def _check_labels(src: NsysSource, table: str, label: npt.NDArray[np.int64]) -> None:
    """Name ids park in the int32 ``name`` field until interned: they must fit (-1: none)."""
    if len(label) and not -1 <= int(label.min()) <= int(label.max()) < 2**31:
        raise CorruptTraceError(f"{src.label}: {table} has a name id outside -1..2**31-1")


def _kernel_name_column(src: NsysSource) -> str:
    for column in ("demangledName", "shortName", "mangledName"):
        if src.schema.has(KERNEL, column):
            if column != "demangledName":
                src.notes.append(f"{KERNEL} has no demangledName: kernel names from {column}")
            return f'ifnull("{column}", -1)'
    src.notes.append(f"{KERNEL} has no name column: kernels are named '<string -1>'")
    return "-1"


def _names(
    src: NsysSource, kind: ActivityKind, label: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    if kind == ActivityKind.KERNEL:
        return src.intern_ids(label)
    if kind == ActivityKind.MEMSET:
        return np.full(len(label), src.strings.intern("[CUDA memset]"), dtype=np.int32)
    labels = _memcpy_labels(src)
    unique, inverse = factorize(label)
    names = [f"[CUDA memcpy {labels.get(int(k), f'kind {int(k)}')}]" for k in unique]
    symbols = np.array([src.strings.intern(n) for n in names], dtype=np.int32)
    return symbols[inverse]


def _memcpy_labels(src: NsysSource) -> dict[int, str]:
    table = "ENUM_CUDA_MEMCPY_OPER"
    if not (src.schema.has(table, "id") and src.schema.has(table, "label")):
        return dict(MEMCPY_LABELS)
    rows = src.conn.execute('SELECT "id", "label" FROM ENUM_CUDA_MEMCPY_OPER').fetchall()
    return {int(i): str(v) for i, v in rows}
