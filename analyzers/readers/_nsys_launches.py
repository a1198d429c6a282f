"""CUDA runtime/driver API tables of an nsys export -> the ``launches`` array.

Only calls that launch GPU work and own a correlation id, and the calls that block the host on
the GPU (``cudaStreamSynchronize`` ..., marked ``sync``: not launches), are kept, filtered inside
SQLite by their StringIds id, so the millions of other API rows (event queries, stream checks) never
reach Python. As for activities, the fast query packs ``correlationId << 32 | nameId`` into one
value; a guard falls back to the plain query for values that do not fit.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from analyzers.model import LAUNCH_DTYPE
from analyzers.readers._arrays import factorize
from analyzers.readers._cuda_api import is_kept_api, normalize_api, sync_column
from analyzers.readers._nsys_sql import Columns, Fill, NsysSource, Query, shrink

RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
TID_BITS = 0xFFFFFF
"""globalTid = globalPid | tid: nsys keeps the OS thread id in the low 24 bits."""
_REQUIRED = ("start", "end", "globalTid", "correlationId", "nameId")
_LOW32 = np.int64(0xFFFFFFFF)


def read_launches(src: NsysSource) -> npt.NDArray[np.void]:
    """Launch and host-sync API rows of the runtime (and driver, if exported) tables,
    de-duplicated."""
    if not src.schema.has(RUNTIME):
        src.notes.append(
            f"no {RUNTIME} table: kernels cannot be linked to launch calls, so range "
            "attribution is unavailable"
        )
    tables = [t for t in (RUNTIME, DRIVER) if src.schema.has(t)]
    api_ids = launch_api_ids(src)
    out = src.allocate(tables, LAUNCH_DTYPE)
    filled = 0
    for table in tables:
        missing = [c for c in _REQUIRED if not src.schema.has(table, c)]
        if missing:
            src.notes.append(f"{table} lacks column(s) {', '.join(missing)}: rows skipped")
        elif api_ids:
            out, filled = src.fetch_into(out, filled, table, _queries(table, api_ids))
    out = drop_duplicate_launches(src, shrink(out, filled))
    out["api"] = _api_symbols(src, api_ids, out["api"])
    out["sync"] = sync_column(out["api"], src.strings)
    return out


def launch_api_ids(src: NsysSource) -> dict[int, str]:
    """StringIds id -> normalized API name for the CUDA calls kept (launches and syncs)."""
    if not src.schema.has("StringIds", "value"):
        return {}
    rows = src.conn.execute(
        "SELECT id, value FROM StringIds WHERE value LIKE 'cu%' AND length(value) < 80"
    ).fetchall()
    return {int(sid): normalize_api(str(v)) for sid, v in rows if is_kept_api(str(v))}


def _queries(table: str, api_ids: dict[int, str]) -> list[tuple[Query, Fill]]:
    ids = ",".join(str(int(i)) for i in api_ids)  # ints we produced: safe to inline
    where = f'WHERE "nameId" IN ({ids}) AND "correlationId" > 0'
    packed = Query(
        f'SELECT "start", "end", "globalTid", CASE WHEN "correlationId" < 4294967296'
        f' AND "nameId" BETWEEN 0 AND 2147483647 THEN ("correlationId" << 32) | "nameId" END'
        f" FROM {table} {where}",
        ("start", "end", "tid", "corr_api"),
        packed=True,
        splits=True,
    )
    plain = Query(
        f'SELECT "start", "end", "globalTid", "correlationId", "nameId" FROM {table} {where}',
        ("start", "end", "tid", "corr", "api"),
        splits=True,
    )

    def fill_packed(cols: Columns, rows: npt.NDArray[np.void]) -> None:
        _fill(cols, rows)
        rows["correlation"] = (cols["corr_api"] >> 32) & _LOW32
        rows["api"] = cols["corr_api"] & _LOW32

    def fill_plain(cols: Columns, rows: npt.NDArray[np.void]) -> None:
        _fill(cols, rows)
        rows["correlation"] = cols["corr"]
        rows["api"] = cols["api"]  # only ids of api_ids pass the WHERE: they fit int32

    return [(packed, fill_packed), (plain, fill_plain)]


def _fill(cols: Columns, rows: npt.NDArray[np.void]) -> None:
    rows["rank"] = -1
    rows["process"] = cols["tid"] & ~np.int64(TID_BITS)
    rows["thread"] = cols["tid"]
    rows["start"], rows["end"] = cols["start"], cols["end"]


def _api_symbols(
    src: NsysSource, api_ids: dict[int, str], column: npt.NDArray[np.int32]
) -> npt.NDArray[np.int32]:
    """StringIds ids -> symbols through a table indexed by id (ids are few and small: only
    the launch APIs' ids pass the SQL filter); only the APIs that occur are interned."""
    if not len(column):
        return np.empty(0, dtype=np.int32)
    present = np.flatnonzero(np.bincount(column, minlength=max(api_ids) + 1))
    table = np.full(max(api_ids) + 1, -1, dtype=np.int32)
    for api in present:
        table[api] = src.strings.intern(api_ids[int(api)])
    return table[column]


def drop_duplicate_launches(src: NsysSource, rows: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """Keep one launch row per (process, correlation id): the outermost (earliest) call.

    Some nsys versions write a runtime row and the driver row it wraps under one correlation
    id; counting both would double every launch.
    """
    src.metadata["duplicate_launch_rows"] = 0
    if len(rows) < 2:
        return rows
    if _ids_increase_per_process(rows):  # the common case: nothing to drop, no sort at all
        return rows
    # globalPid keeps its low 24 bits zero, so >> 24 gives small dense process keys.
    _, process_index = factorize(rows["process"] >> 24)
    order = np.lexsort(
        (rows["start"] - rows["end"], rows["start"], rows["correlation"], process_index)
    )
    p, c = process_index[order], rows["correlation"][order]
    first = np.concatenate(([True], (p[1:] != p[:-1]) | (c[1:] != c[:-1])))
    src.metadata["duplicate_launch_rows"] = int(len(rows) - first.sum())
    return rows[np.sort(order[first])]


def _ids_increase_per_process(rows: npt.NDArray[np.void], limit: int = 64) -> bool:
    """True when each process's correlation ids strictly increase in row order (no duplicate).

    nsys appends API rows per process in call order and CUPTI numbers calls in that order, so
    this linear check nearly always settles the question; a sort is only needed when it fails.
    """
    process, correlation = rows["process"], rows["correlation"]
    early = np.unique(process[: min(len(process), 4096)])  # processes are few and start early
    seen = 0
    for value in early[:limit]:
        ids = correlation[process == value]
        seen += len(ids)
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            return False
    return seen == len(rows)  # every row belonged to a checked process
