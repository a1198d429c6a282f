"""Read an Nsight Systems export (``.sqlite``, ``.sqlite.gz``, ``.nsys-rep``) into a ``Trace``.

Table / column mapping (everything else in the export is ignored):

============================== ==================================================================
nsys table                     normalized rows
============================== ==================================================================
CUPTI_ACTIVITY_KIND_KERNEL     activities (KERNEL): name = demangledName (else shortName) via
                               StringIds; graphNodeId kept; process = globalPid
CUPTI_ACTIVITY_KIND_MEMCPY     activities (MEMCPY), named "[CUDA memcpy <copyKind label>]"
CUPTI_ACTIVITY_KIND_MEMSET     activities (MEMSET), named "[CUDA memset]"
CUPTI_ACTIVITY_KIND_RUNTIME    launches: only launch/memcpy/memset API rows that own a
(+ _DRIVER if present)         correlation id; API name = nameId via StringIds without the
                               ``_v7000`` suffix; process = globalTid with the low 24 (tid) bits
                               cleared, which equals the kernel's globalPid
NVTX_EVENTS                    ranges: push/pop and start/end ranges (types from
                               ENUM_NSYS_EVENT_TYPE); text inline or via textId; ranges of the
                               "Python NVTX" domain (``--python-functions-trace``) are PYTHON,
                               others NVTX; ``ProfilerStep#N`` ranges are STEP
ThreadNames                    thread_names
============================== ==================================================================

Tables are created lazily by nsys and columns vary across versions: anything missing becomes a
note in ``Trace.notes`` (or ``metadata["absent_tables"]`` when it only means "no such events").
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from analyzers.errors import CorruptTraceError, UnsupportedTraceError
from analyzers.model import ActivityKind, Trace
from analyzers.readers import _nsys_ranges
from analyzers.readers._arrow_sqlite import open_arrow
from analyzers.readers._files import DEFAULT_MAX_DECOMPRESSED, decompressed_copy, is_gzip
from analyzers.readers._nsys_activities import KERNEL, MEMCPY, MEMSET, read_activities
from analyzers.readers._nsys_launches import DRIVER, RUNTIME, read_launches
from analyzers.readers._nsys_sql import NsysSource, Query
from analyzers.readers._ranks import DEVICE_ORDER, PROCESS_ORDER
from analyzers.readers._sqlite_guard import inspect_schema, open_readonly

NVTX = _nsys_ranges.NVTX
EVENT_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME, DRIVER, NVTX)
"""Tables holding events; an export needs at least one to be worth reading."""
SIGNATURE_TABLES = ("StringIds",)
"""Tables every nsys export has; without them the file is some other SQLite database."""
READ_TABLES = {
    *EVENT_TABLES,
    "StringIds",
    "ThreadNames",
    "ENUM_NSYS_EVENT_TYPE",
    "ENUM_CUDA_MEMCPY_OPER",
    "META_DATA_EXPORT",
    "TARGET_INFO_GPU",
}


def read_nsys(
    path: str | Path,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
    gzipped: bool | None = None,
) -> Trace:
    """Read an nsys export into the normalized model.

    Args:
        path: ``.sqlite`` export, the same gzipped, or a ``.nsys-rep`` (needs ``nsys``).
        max_decompressed_bytes: cap for ``.sqlite.gz`` expansion (``_files.inflated``).
        gzipped: whether the file is gzip, when the caller already knows (a ``TraceInput``);
            None looks at the file's first bytes.

    Raises:
        UnsupportedTraceError: not an nsys export, or a ``.nsys-rep`` without ``nsys``.
        HostileTraceError: the file carries triggers, views or other executable schema.
        CorruptTraceError: truncated, unreadable, or no events.
    """
    source = Path(path)
    with _sqlite_file(source, max_decompressed_bytes, gzipped) as db_path:
        return read_sqlite(db_path, label=str(source))


@contextlib.contextmanager
def _sqlite_file(source: Path, max_bytes: int, gzipped: bool | None) -> Iterator[Path]:
    if source.name.endswith(".nsys-rep"):
        with tempfile.TemporaryDirectory(prefix="cptrace-nsys-") as tmp:
            yield export_nsys_rep(source, Path(tmp) / (source.stem + ".sqlite"))
    elif is_gzip(source) if gzipped is None else gzipped:
        with decompressed_copy(source, max_bytes) as copy:
            yield copy
    else:
        yield source


def export_nsys_rep(rep: Path, out: Path) -> Path:
    """Convert a ``.nsys-rep`` to SQLite with the ``nsys`` CLI; returns ``out``."""
    command = ["nsys", "export", "--type", "sqlite", "--output", str(out), str(rep)]
    if shutil.which("nsys") is None:
        raise UnsupportedTraceError(
            f"{rep}: reading a .nsys-rep needs Nsight Systems' `nsys` on PATH; export it "
            f"where nsys is installed and pass the .sqlite instead: {' '.join(command)}"
        )
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0 or not out.exists():
        raise CorruptTraceError(
            f"{rep}: `{' '.join(command)}` failed (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        )
    return out


def read_sqlite(db_path: Path, *, label: str | None = None) -> Trace:
    """Read an uncompressed export; ``label`` is the name used in messages and ``source``."""
    name = label or str(db_path)
    conn = open_readonly(db_path)
    arrow = None
    try:
        schema = inspect_schema(conn, Path(name), READ_TABLES)
        src = NsysSource(conn=conn, schema=schema, label=name, file_bytes=db_path.stat().st_size)
        _require_nsys(src)
        # Only after the schema passed inspection may a second connection read the file.
        src.arrow = arrow = open_arrow(db_path)
        src.metadata["sqlite_backend"] = "adbc" if arrow is not None else "sqlite3"
        with _small_pages():
            return _read_all(src)
    except sqlite3.DatabaseError as exc:
        raise CorruptTraceError(f"{name}: SQLite error while reading the export ({exc})") from exc
    finally:
        if arrow is not None:
            arrow.close()
        conn.close()


@contextlib.contextmanager
def _small_pages() -> Iterator[None]:
    """Turn off numpy's transparent-huge-page advice while the reader fills its arrays.

    Why: the reader writes each big array once, front to back. With the advice, every first
    touch of a 2 MiB region faults in a whole huge page (zeroing it, often compacting memory
    first); on the 2-million-kernel benchmark that was about 0.4 s of system time out of 4.8 s
    of CPU, against about 0.1 s with ordinary pages. The advice is only a hint, so switching it
    off (process-wide, restored afterwards) cannot change any result.
    """
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    setter = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if setter is None:
        yield
        return
    previous = setter(False)
    try:
        yield
    finally:
        setter(previous)


def _require_nsys(src: NsysSource) -> None:
    if not all(src.schema.has(t) for t in SIGNATURE_TABLES):
        raise UnsupportedTraceError(
            f"{src.label}: SQLite file is not an nsys export (no StringIds table; expected "
            f"tables such as {KERNEL}, {RUNTIME}, {NVTX})"
        )
    if not any(src.schema.has(t) for t in EVENT_TABLES):
        raise CorruptTraceError(
            f"{src.label}: nsys export has no events (none of {', '.join(EVENT_TABLES)})"
        )


def _read_all(src: NsysSource) -> Trace:
    activities = read_activities(src)
    launches = read_launches(src)
    ranks, rank_source = _assign_ranks(activities)
    span = _span(activities, launches)
    ranges = _nsys_ranges.read_ranges(src, span)
    if not (len(activities) or len(launches) or len(ranges)):
        raise CorruptTraceError(f"{src.label}: nsys export has no events in {EVENT_TABLES}")
    for table in (activities, launches, ranges):
        table["rank"] = _rank_column(table["process"], ranks)
    src.metadata.update(_export_facts(src), rank_source=rank_source)
    return Trace(
        source=src.label,
        format="nsys",
        strings=src.strings,
        activities=activities,
        launches=launches,
        ranges=ranges,
        ranks=ranks,
        thread_names=_thread_names(src),
        span=_span(activities, launches, ranges),
        notes=src.notes,
        metadata=src.metadata,
    )


def _assign_ranks(activities: npt.NDArray[np.void]) -> tuple[dict[int, int], str]:
    """Process -> rank: by CUDA device when each process drives one device, else by order."""
    # Column views, not a row copy: the activity table can be hundreds of MB.
    mask = activities["kind"] == ActivityKind.KERNEL
    if not mask.any():
        mask = np.ones(len(activities), dtype=bool)
    if not len(activities):
        return {}, "none (no GPU activities)"
    kernel_process = activities["process"][mask]
    kernel_device = activities["device"][mask]
    # (process, device) pairs: processes are few, so one masked pass per process and a
    # bincount over the int16 device ids beat sorting millions of composite keys.
    distinct_processes = _distinct_few(kernel_process)
    if len(distinct_processes) <= _FEW:
        pairs = [
            (int(proc), int(dev))
            for proc in distinct_processes
            for dev in _distinct_int16(kernel_device[kernel_process == proc])
        ]
    else:  # many processes (a crafted or merged export): one sort of all pairs
        stacked = np.column_stack((kernel_process, kernel_device.astype(np.int64)))
        pairs = [(int(proc), int(dev)) for proc, dev in np.unique(stacked, axis=0)]
        del stacked
    del kernel_device, distinct_processes
    processes = np.array([proc for proc, _ in pairs], dtype=np.int64)
    devices = np.array([dev for _, dev in pairs], dtype=np.int64)
    one_each = len(np.unique(processes)) == len(processes) == len(np.unique(devices))
    if one_each:
        order = np.argsort(devices)
        return {int(processes[i]): rank for rank, i in enumerate(order)}, DEVICE_ORDER
    starts = activities["start"][mask]
    first_seen = {int(p): int(starts[kernel_process == p].min()) for p in np.unique(processes)}
    ordered = sorted(first_seen, key=lambda p: (first_seen[p], p))
    return {p: rank for rank, p in enumerate(ordered)}, PROCESS_ORDER


_FEW = 64
"""Up to this many distinct values, a masked pass per value beats sorting millions of rows."""


def _distinct_few(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sorted distinct values: a masked pass per value while there are few, else a sort."""
    remaining = values
    found: list[np.int64] = []
    while len(remaining) and len(found) <= _FEW:
        found.append(remaining[0])
        remaining = remaining[remaining != remaining[0]]
    if len(remaining):
        return np.unique(values)
    return np.sort(np.asarray(found, dtype=np.int64))


def _distinct_int16(values: npt.NDArray[np.int16]) -> npt.NDArray[np.int64]:
    """Sorted distinct int16 values in linear time (a bincount over the int16 range)."""
    counts = np.bincount(values.astype(np.int64) + 32768, minlength=65536)
    return np.flatnonzero(counts) - 32768


def _rank_column(process: npt.NDArray[np.int64], ranks: dict[int, int]) -> npt.NDArray[np.int16]:
    out = np.full(len(process), -1, dtype=np.int16)
    for proc, rank in ranks.items():
        out[process == proc] = rank
    return out


def _span(*tables: npt.NDArray[np.void]) -> tuple[int, int]:
    starts = [int(t["start"].min()) for t in tables if len(t)]
    ends = [int(t["end"].max()) for t in tables if len(t)]
    return (min(starts), max(ends)) if starts else (0, 0)


def _thread_names(src: NsysSource) -> dict[int, str]:
    if not (src.schema.has("ThreadNames", "globalTid") and src.schema.has("ThreadNames", "nameId")):
        return {}
    query = Query('SELECT "globalTid", ifnull("nameId", -1) FROM ThreadNames', ("tid", "name"))
    raw = src.fetch("ThreadNames", query)
    values = src.string_values(raw["name"])
    return {
        int(t): values[int(n)]
        for t, n in zip(raw["tid"], raw["name"], strict=True)
        if int(n) in values
    }


def _export_facts(src: NsysSource) -> dict[str, object]:
    facts: dict[str, object] = {}
    if src.schema.has("META_DATA_EXPORT", "name") and src.schema.has("META_DATA_EXPORT", "value"):
        rows = dict(src.conn.execute('SELECT "name", "value" FROM META_DATA_EXPORT').fetchall())
        facts["nsys_version"] = rows.get("EXPORT_PRODUCT_VERSION")
        facts["export_schema_version"] = rows.get("EXPORT_SCHEMA_VERSION")
        # ``nsys export --times``: the export holds only these time ranges of the capture
        facts["export_times"] = rows.get("EXPORT_PARAM_TIMES_TO_EXPORT") or None
    if src.schema.has("TARGET_INFO_GPU", "name"):
        facts["gpus"] = [str(r[0]) for r in src.conn.execute('SELECT "name" FROM TARGET_INFO_GPU')]
    return facts
