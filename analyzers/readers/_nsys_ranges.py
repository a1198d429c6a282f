"""NVTX_EVENTS -> annotation ranges, with domains, Python-function frames and nesting.

How the rows look in an nsys export (checked on the 2025.3 export in tests/data):

* ``eventType`` is an ``ENUM_NSYS_EVENT_TYPE`` id: 59 ``NvtxPushPopRange``, 60
  ``NvtxStartEndRange``, 75 ``NvtxDomainCreate`` (its ``text`` is the domain name). Marks and
  other types are not ranges and are skipped.
* The range name is the inline ``text`` or, for registered strings, ``textId`` -> StringIds.
* ``domainId`` is per process (0 = default domain). ``nsys --python-functions-trace`` emits
  each traced function as a push/pop range named by its qualified path
  (``transformer_engine...context_parallel.get_cu_seqlens_on_cp_rank``) in the domain
  "Python NVTX"; those become ``RangeKind.PYTHON``, all others ``RangeKind.NVTX``.
* ``end`` is NULL for a range still open when the capture stopped: it ends at the trace end.
"""

from __future__ import annotations

import re
import sqlite3

import numpy as np
import numpy.typing as npt

from analyzers.errors import CorruptTraceError
from analyzers.model import RANGE_DTYPE, RangeKind
from analyzers.readers._labels import relabel
from analyzers.readers._nesting import nest
from analyzers.readers._nsys_sql import (
    CHUNK_ROWS,
    Columns,
    Fill,
    NsysSource,
    Query,
    shrink,
    store_chunk,
)

NVTX = "NVTX_EVENTS"
PYTHON_NVTX_DOMAINS = frozenset({"Python NVTX"})
"""NVTX domains whose ranges are Python function frames (nsys --python-functions-trace)."""
STEP_NAME = re.compile(r"^ProfilerStep#\d+$")

_RANGE_TYPES = ("NvtxPushPopRange", "NvtxStartEndRange", "NvtxtPushPopRange", "NvtxtStartEndRange")
_DOMAIN_CREATE = "NvtxDomainCreate"
_KNOWN_TYPE_IDS = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60, _DOMAIN_CREATE: 75}
_TID_BITS = 0xFFFFFF
_CASE_NAMES = 64
"""Up to this many distinct inline names SQLite maps text to symbol with a CASE; beyond, the
texts come out row by row and are interned in Python (a SQL join would be O(rows x names))."""
_SAMPLE_ROWS = 1 << 16
"""Range rows whose inline names are listed up front (see ``_fetch_ranges``)."""
_UNKNOWN_TEXT = 2**31 - 1
"""Inline-name value of a text the sampled name list lacks; no symbol id gets this large."""
_RAW_FIELDS = ("start", "end", "tid", "domain", "event_type", "text_id", "inline")
_RAW = np.dtype([(name, np.int64) for name in _RAW_FIELDS])


def read_ranges(src: NsysSource, span: tuple[int, int]) -> npt.NDArray[np.void]:
    """All NVTX ranges of the export, nested per thread; empty (with a note) when unavailable."""
    if not src.schema.has(NVTX):
        src.notes.append(f"no {NVTX} table: range attribution unavailable")
        return np.empty(0, RANGE_DTYPE)
    missing = [c for c in ("start", "eventType", "globalTid") if not src.schema.has(NVTX, c)]
    if missing:
        src.notes.append(f"{NVTX} lacks {', '.join(missing)}: range attribution unavailable")
        return np.empty(0, RANGE_DTYPE)
    types = _event_type_ids(src)
    range_types = [types[n] for n in _RANGE_TYPES if n in types]
    raw, names = _fetch_ranges(src, range_types)
    # Push/pop ranges (of every domain, Python-function frames included) follow the call
    # stack of their thread; start/end ranges may overlap anything, so they nest separately.
    family = raw["event_type"] != types.get("NvtxPushPopRange", 59)
    out = np.empty(len(raw), RANGE_DTYPE)  # every field is written below (rank by the caller)
    out["rank"] = -1
    process = raw["tid"] & ~np.int64(_TID_BITS)
    out["process"] = process
    out["thread"] = raw["tid"]
    out["start"] = raw["start"]
    # Ranges still open when the capture stopped (NULL end) end at the trace end.
    trace_end = max(span[1], int(raw["start"].max())) if len(raw) else span[1]
    out["end"] = np.where(raw["end"] >= raw["start"], raw["end"], trace_end)
    out["kind"] = _kinds(src, process, raw["domain"], names, types.get(_DOMAIN_CREATE))
    del process
    out["name"] = relabel(names, src.strings, emit_nvtx_label)
    del raw, names  # free the raw rows before nesting allocates its sort keys
    out["parent"], out["depth"] = nest(out["thread"], out["start"], out["end"], family)
    return out


_EMIT_NVTX_COUNTERS = re.compile(r", (?:seq|op_id) = -?\d+|, input_op_ids = .*$", re.DOTALL)


def emit_nvtx_label(text: str) -> str:
    """``torch.autograd.profiler.emit_nvtx``'s label without its per-call numbers.

    emit_nvtx names each op ``aten::mm, seq = 12, op_id = 345, sizes = [[8, 8], [8, 8]],
    input_op_ids = [(344, 0)]``: the sequence number and op ids count calls, so no two calls
    (nor two runs) share a name and nothing lines up. Kept: the op and its sizes.

    >>> emit_nvtx_label("aten::mm, seq = 1, op_id = 34, sizes = [[8, 8]], input_op_ids = [(3, 0)]")
    'aten::mm, sizes = [[8, 8]]'
    """
    if ", seq = " not in text and ", op_id = " not in text:
        return text
    return _EMIT_NVTX_COUNTERS.sub("", text)


def _event_type_ids(src: NsysSource) -> dict[str, int]:
    table = "ENUM_NSYS_EVENT_TYPE"
    if not (src.schema.has(table, "id") and src.schema.has(table, "name")):
        src.metadata["nvtx_event_types"] = "ENUM_NSYS_EVENT_TYPE absent: assumed 59/60/75"
        return dict(_KNOWN_TYPE_IDS)
    rows = src.conn.execute(f'SELECT "id", "name" FROM {table}').fetchall()
    return {str(name): int(i) for i, name in rows}


def _fetch_ranges(
    src: NsysSource, range_types: list[int]
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.int32]]:
    """Rows of the range event types plus their interned names.

    Inline ``text`` values repeat a few hundred distinct names over millions of rows, so the
    distinct values are interned first and SQLite maps each row's text to its symbol id (a
    CASE, or a VALUES table for many names): rows then leave SQLite as integers only.
    ``textId`` names are mapped through StringIds afterwards.
    """
    if not range_types:
        return np.empty(0, _RAW), np.empty(0, np.int32)
    types = ",".join(str(t) for t in range_types)
    where = f'WHERE "eventType" IN ({types})'
    raw = None
    # The names of the first rows nearly always are all the names (the same few hundred
    # functions repeat every step): a sample saves a full DISTINCT scan of the table. Should a
    # later row carry a name the sample missed, the fetch says so and the complete list is read.
    texts = _inline_texts(src, where, _SAMPLE_ROWS)
    if len(texts) <= _CASE_NAMES:
        raw = _fetch_with_case(src, texts, where)
    if raw is None:
        texts = _inline_texts(src, where, None)
        if len(texts) > _CASE_NAMES:
            raw = _fetch_ranges_by_row(src, where)
        else:
            raw = _fetch_with_case(src, texts, where)
            assert raw is not None  # the complete list leaves no text unknown
    names = raw["inline"].astype(np.int32)
    by_id = (names < 0) & (raw["text_id"] >= 0)
    names[by_id] = src.intern_ids(raw["text_id"][by_id])
    names[names < 0] = src.strings.intern("<unnamed NVTX range>")
    return raw, names


def _inline_texts(src: NsysSource, where: str, sample: int | None) -> list[str]:
    """Distinct inline range names (at most ``_CASE_NAMES + 1``), among the first ``sample``
    range rows or all of them."""
    if not src.schema.has(NVTX, "text"):
        return []
    rows = f'SELECT "text" FROM {NVTX} {where} AND "text" IS NOT NULL'
    if sample is not None:
        rows += f" LIMIT {int(sample)}"
    distinct = f'SELECT DISTINCT "text" FROM ({rows}) LIMIT {_CASE_NAMES + 1}'
    return [str(row[0]) for row in src.conn.execute(distinct)]


def _fetch_with_case(src: NsysSource, texts: list[str], where: str) -> npt.NDArray[np.void] | None:
    """Range rows with inline names mapped by SQL; None when a text outside ``texts`` occurs."""
    queries = _range_queries(src, *_case_name_sql(src, texts, where))
    out = src.allocate((NVTX,), _RAW)
    out, filled = src.fetch_into(out, 0, NVTX, queries)
    raw = shrink(out, filled)
    if len(raw) and bool((raw["inline"] == _UNKNOWN_TEXT).any()):
        return None
    return raw


def _case_name_sql(src: NsysSource, texts: list[str], where: str) -> tuple[str, str, str, str]:
    """SQL pieces (head, has-inline-text test, inline-symbol expression, tail) mapping ``text``
    to symbol ids.

    Texts go in as hex blob literals cast to TEXT: whatever bytes a crafted file holds, they
    cannot end the literal, and no bound parameters are needed (the Arrow path has none). A
    text missing from ``texts`` (the sampled list) maps to ``_UNKNOWN_TEXT``.
    """
    head = f'SELECT e."start", {src.column(NVTX, "end")}, e."globalTid"'
    tail = f" FROM {NVTX} AS e {where.replace('WHERE ', 'WHERE e.')}"
    if not src.schema.has(NVTX, "text"):
        return head, "0", str(_UNKNOWN_TEXT), tail
    has_text = 'e."text" IS NOT NULL'
    if not texts:
        return head, has_text, str(_UNKNOWN_TEXT), tail
    whens = " ".join(
        f"WHEN CAST(X'{text.encode('utf-8', 'surrogatepass').hex()}' AS TEXT)"
        f" THEN {src.strings.intern(text)}"
        for text in texts
    )
    return head, has_text, f'CASE e."text" {whens} ELSE {_UNKNOWN_TEXT} END', tail


def _copy_raw(cols: Columns, rows: npt.NDArray[np.void]) -> None:
    for name in _RAW_FIELDS:
        rows[name] = cols[name]


def _fetch_ranges_by_row(src: NsysSource, where: str) -> npt.NDArray[np.void]:
    """Ranges with many distinct inline names: texts leave SQLite and are interned here."""
    sql = (
        f'SELECT "start", {src.column(NVTX, "end")}, "globalTid", '
        f'{src.column(NVTX, "domainId", "0")}, "eventType", {src.column(NVTX, "textId")}, '
        f'"text" FROM {NVTX} {where}'
    )
    out = src.allocate((NVTX,), _RAW)
    filled = 0
    intern = src.strings.intern
    try:
        cursor = src.conn.execute(sql)
        while rows := cursor.fetchmany(CHUNK_ROWS):
            ints = np.array([row[:6] for row in rows], dtype=np.int64).reshape(len(rows), 6)
            names = [-1 if row[6] is None else intern(str(row[6])) for row in rows]
            columns = dict(zip(_RAW_FIELDS[:6], ints.T, strict=True))
            columns["inline"] = np.array(names, dtype=np.int64)
            out, filled = store_chunk(out, filled, columns, _copy_raw)
    except sqlite3.DatabaseError as exc:
        raise CorruptTraceError(f"{src.label}: cannot read table {NVTX} ({exc})") from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise CorruptTraceError(f"{src.label}: {NVTX} holds a non-integer value ({exc})") from exc
    return shrink(out, filled)


def _range_queries(
    src: NsysSource, head: str, has_text: str, inline: str, tail: str
) -> list[tuple[Query, Fill]]:
    """Packed: ``domainId << 40 | eventType << 32 | name key`` in one value, where the key is
    ``2**31 + symbol`` for inline text, the ``textId`` below ``2**31 - 1``, or ``2**31 - 1``
    for no name. Plain: one column each.

    The text -> symbol CASE appears once and only runs for rows that have a text: it is the
    costliest expression of the query (up to ``_CASE_NAMES`` string comparisons per row).
    """
    domain, text_id = src.column(NVTX, "domainId", "0"), src.column(NVTX, "textId")
    key = (
        f"CASE WHEN {has_text} THEN 2147483648 + {inline}"
        f" WHEN {text_id} BETWEEN 0 AND 2147483646 THEN {text_id} ELSE 2147483647 END"
    )
    packed = Query(
        f'{head}, CASE WHEN {domain} BETWEEN 0 AND 8388607 AND e."eventType" BETWEEN 0 AND 255'
        f' THEN ({domain} << 40) | (e."eventType" << 32) | {key} END{tail}',
        ("start", "end", "tid", "packed"),
        packed=True,
        splits=True,
    )
    plain = Query(
        f'{head}, {domain}, e."eventType", {text_id},'
        f" CASE WHEN {has_text} THEN {inline} ELSE -1 END{tail}",
        ("start", "end", "tid", "domain", "event_type", "text_id", "inline"),
        splits=True,
    )

    def fill_packed(cols: Columns, rows: npt.NDArray[np.void]) -> None:
        rows["start"], rows["end"], rows["tid"] = cols["start"], cols["end"], cols["tid"]
        value = cols["packed"]
        rows["domain"] = value >> 40
        rows["event_type"] = (value >> 32) & 0xFF
        key = value & np.int64(0xFFFFFFFF)
        inline = key >= 2**31
        rows["inline"] = np.where(inline, key - 2**31, -1)
        rows["text_id"] = np.where(inline | (key == 2**31 - 1), -1, key)

    def fill_plain(cols: Columns, rows: npt.NDArray[np.void]) -> None:
        for name in plain.columns:
            rows[name] = cols[name]

    return [(packed, fill_packed), (plain, fill_plain)]


def _kinds(
    src: NsysSource,
    process: npt.NDArray[np.int64],
    domain: npt.NDArray[np.int64],
    names: npt.NDArray[np.int32],
    domain_create: int | None,
) -> npt.NDArray[np.int8]:
    kinds = np.full(len(names), RangeKind.NVTX, dtype=np.int8)
    domains = _domain_names(src, domain_create)
    src.metadata["nvtx_domains"] = sorted(set(domains.values()))
    for (proc, domain_id), name in domains.items():
        if name in PYTHON_NVTX_DOMAINS:
            kinds[(process == proc) & (domain == domain_id)] = RangeKind.PYTHON
    if not len(names):
        return kinds
    # Symbol ids are small and dense: which occur is a bincount, not a sort of every row.
    present = np.flatnonzero(np.bincount(names))
    is_step = np.zeros(int(present[-1]) + 1, dtype=bool)
    for symbol in present.tolist():
        is_step[symbol] = STEP_NAME.match(src.strings[symbol]) is not None
    if is_step.any():
        kinds[is_step[names]] = RangeKind.STEP
    return kinds


def _domain_names(src: NsysSource, domain_create: int | None) -> dict[tuple[int, int], str]:
    """(process, domainId) -> domain name, from the NvtxDomainCreate rows."""
    if domain_create is None or not src.schema.has(NVTX, "domainId"):
        return {}
    text = '"text"' if src.schema.has(NVTX, "text") else "NULL"
    rows = src.conn.execute(
        f'SELECT "globalTid", "domainId", {text}, {src.column(NVTX, "textId")} FROM {NVTX}'
        f' WHERE "eventType" = {int(domain_create)}'
    ).fetchall()
    by_id = src.string_values(np.array([r[3] for r in rows], dtype=np.int64))
    found = {}
    for tid, domain_id, inline, text_id in rows:
        name = inline if inline is not None else by_id.get(int(text_id))
        if name is not None and domain_id is not None:
            found[(int(tid) & ~_TID_BITS, int(domain_id))] = str(name)
    return found
