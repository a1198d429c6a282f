"""One window of an analysed trace as Chrome trace-event JSON, for the Perfetto UI.

What the file holds is exactly what cptrace measured in that window (the timeline window of
``analyzers.timeline``, one per rank): every GPU activity clipped to the window, with its helper,
category and account part as ``args``; the launch calls and the catalogued ranges of the
launching threads inside the window; and the account's idle gaps as slices on a track of their
own, named by cause. Nothing lies outside its rank's window.

Layout (``pid``/``tid`` are track ids, named by ``ph: "M"`` metadata events):

==========================  ===================================================================
``pid = 2 * rank + 1``      "rank R GPU": one ``tid`` per stream (the stream id); ``tid``
                            ``IDLE_TID`` is "idle gaps (cptrace account)"
``pid = 2 * rank + 2``      "rank R CPU": one ``tid`` per launching thread (numbered 1, 2, ...)
==========================  ===================================================================

Events are Kineto-shaped (``cat`` ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` with
``args.device``, ``args.stream``, ``args.correlation``; ``cuda_runtime`` launches;
``user_annotation`` ranges), so cptrace's own Kineto reader reads the file back. Timestamps are
microseconds from ``otherData.cptrace.origin_ns`` (the earliest window start), with three
decimals: exact integer nanoseconds, small enough that a float holds them exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzers.account.build import Pieces, account_pieces
from analyzers.attribution import Attribution, RangeHelpers
from analyzers.catalog import Catalog
from analyzers.compare import CompareError
from analyzers.model import ActivityKind, Trace
from analyzers.report import AccountPartKind, Window

CORRELATION_STRIDE = 1 << 40
"""Added ``rank`` times to every correlation id of a file holding several ranks: each rank's
ids count from 1, and one file needs them distinct for its launches and activities to pair up
again when the file is read back."""
IDLE_TID = 1_000_000
"""Track id of the idle-gap track inside each rank's GPU process."""
IDLE_CATEGORY = "cptrace_idle"
"""``cat`` of the idle-gap slices (no Kineto category: readers skip them)."""
_CATS = {
    ActivityKind.KERNEL: "kernel",
    ActivityKind.MEMCPY: "gpu_memcpy",
    ActivityKind.MEMSET: "gpu_memset",
}


class ExportError(CompareError):
    """The requested window is not in the analysis (a ``CompareError``: the same mistake, a
    window the report does not have, so the service and the CLI map it the same way)."""


def select_window(windows: Sequence[Window], wanted: str) -> list[int]:
    """Indices of the windows ``wanted`` names, one per rank.

    ``wanted`` is a window's own name (``ProfilerStep#3``) or a group (``arm:auto_clone``),
    optionally with ``#N`` for the N-th window of that group on each rank (default the first).

    :raises ExportError: naming the groups there are.
    """
    by_name = [i for i, w in enumerate(windows) if w.name == wanted]
    if by_name:
        first: dict[int, int] = {}
        for i in by_name:
            first.setdefault(windows[i].rank, i)
        return sorted(first.values(), key=lambda i: windows[i].rank)
    group, _, index = wanted.rpartition("#")
    if not group or not index.isdigit():
        group, index = wanted, "0"
    chosen = [
        i for i, w in enumerate(windows) if (w.group or w.name) == group and w.index == int(index)
    ]
    if not chosen:
        groups = sorted({w.group or w.name for w in windows})
        raise ExportError(
            f"no window {wanted!r} in the analysis; window groups: {', '.join(groups)} "
            f"(add '#N' for the N-th window of a group)"
        )
    return sorted(chosen, key=lambda i: windows[i].rank)


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


@dataclass(frozen=True, slots=True)
class _Shares:
    """Per activity row: its account parts and their ns in the window."""

    parts: dict[int, list[tuple[str, str, int]]]


def _shares(pieces: Pieces) -> _Shares:
    parts: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    busy = np.flatnonzero(pieces.unit < pieces.activities)
    for i in busy.tolist():
        line = pieces.lines[int(pieces.line[i])]
        parts[int(pieces.unit[i])].append((line.part.value, line.label, int(pieces.duration[i])))
    return _Shares(dict(parts))


def perfetto_trace(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    wanted: str,
) -> dict[str, Any]:
    """The Chrome trace-event document of window ``wanted`` (see the module docstring).

    :raises ExportError: when no window matches ``wanted``.
    """
    selected = select_window(windows, wanted)
    pieces = account_pieces(trace, att, ranges, catalog, windows, selected)
    origin = min(w.start_ns for w in pieces.windows)
    shares = _shares(pieces)
    events: list[dict[str, Any]] = []
    threads: dict[tuple[int, int], int] = {}
    acts, launches, strings = trace.activities, trace.launches, trace.strings
    ranks = [w.window.rank for w in pieces.windows]
    stride = CORRELATION_STRIDE if len(set(ranks)) > 1 else 0

    def slice_(
        name: str, cat: str, pid: int, tid: int, lo: int, hi: int, args: dict[str, Any]
    ) -> None:
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": _us(lo - origin),
                "dur": _us(hi - lo),
                "args": args,
            }
        )

    def cpu_tid(rank: int, thread: int) -> int:
        return threads.setdefault((rank, thread), 1 + sum(1 for r, _ in threads if r == rank))

    for seg, w in enumerate(pieces.windows):
        rank, lo_w, hi_w = w.window.rank, w.start_ns, w.end_ns
        gpu_pid, cpu_pid = 2 * rank + 1, 2 * rank + 2
        mine = np.flatnonzero(pieces.clipped_seg == seg)
        streams = set()
        launched: set[int] = set()
        for j in mine.tolist():
            row = int(pieces.clipped_row[j])
            lo, hi = int(pieces.clipped_start[j]), int(pieces.clipped_end[j])
            helper = int(att.helper[row])
            stream = int(acts["stream"][row])
            streams.add(stream)
            parts = shares.parts.get(row, [])
            args: dict[str, Any] = {
                "device": int(acts["device"][row]),
                "stream": stream,
                "correlation": int(acts["correlation"][row]) + stride * rank,
                "rank": rank,
                "helper": att.name_of(helper),
                "category": att.category_of(helper).value,
                "account part": parts[0][0] if parts else "overlapped",
                "account": {f"{p} ({label})": ns for p, label, ns in parts},
            }
            if int(acts["bytes"][row]) >= 0:  # memcpy / memset: what it moved or set
                args["bytes"] = int(acts["bytes"][row])
            if (lo, hi) != (int(acts["start"][row]), int(acts["end"][row])):
                args["clipped from"] = [
                    _us(int(acts["start"][row]) - origin),
                    _us(int(acts["end"][row]) - origin),
                ]
            slice_(
                strings[int(acts["name"][row])],
                _CATS[ActivityKind(int(acts["kind"][row]))],
                gpu_pid,
                stream,
                lo,
                hi,
                args,
            )
            if att.launch[row] >= 0:
                launched.add(int(att.launch[row]))
        for lrow in sorted(launched):
            lo = max(int(launches["start"][lrow]), lo_w)
            hi = min(int(launches["end"][lrow]), hi_w)
            if hi < lo or lo >= hi_w:
                continue
            slice_(
                strings[int(launches["api"][lrow])],
                "cuda_runtime",
                cpu_pid,
                cpu_tid(rank, int(launches["thread"][lrow])),
                lo,
                hi,
                {"correlation": int(launches["correlation"][lrow]) + stride * rank, "rank": rank},
            )
        _ranges(trace, att, ranges, rank, lo_w, hi_w, slice_, cpu_pid, cpu_tid)
        idle = np.flatnonzero((pieces.seg == seg) & (pieces.unit >= pieces.activities))
        for i in idle.tolist():
            line = pieces.lines[int(pieces.line[i])]
            lo = int(pieces.start[i])
            thread = int(pieces.thread[i])
            slice_(
                f"{line.part.value}: {line.label}",
                IDLE_CATEGORY,
                gpu_pid,
                IDLE_TID,
                lo,
                lo + int(pieces.duration[i]),
                {
                    "part": line.part.value,
                    "label": line.label,
                    "detail": line.detail,
                    "thread": trace.thread_names.get(thread, str(thread)) if thread >= 0 else None,
                    "rank": rank,
                },
            )
        events += _names(rank, gpu_pid, cpu_pid, streams)
    for (rank, thread), tid in threads.items():
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 2 * rank + 2,
                "tid": tid,
                "args": {"name": trace.thread_names.get(thread, f"thread {thread}")},
            }
        )
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "displayTimeUnit": "ns",
        "traceEvents": events,
        "otherData": {
            "cptrace": {
                "window": wanted,
                "origin_ns": origin,
                "windows": [
                    {
                        "rank": w.window.rank,
                        "name": w.window.name,
                        "group": w.window.group,
                        "index": w.window.index,
                        "basis": w.basis.value,
                        "start_us": _us(w.start_ns - origin),
                        "end_us": _us(w.end_ns - origin),
                    }
                    for w in pieces.windows
                ],
                "parts": [k.value for k in AccountPartKind],
                # read back by analyzers.readers.kineto: one file, several ranks
                "process_ranks": {str(2 * r + 2): r for r in sorted(set(ranks))},
            }
        },
    }
    if len(set(ranks)) == 1:
        doc["distributedInfo"] = {"rank": ranks[0]}
    return doc


def _ranges(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    rank: int,
    lo_w: int,
    hi_w: int,
    slice_: Any,
    cpu_pid: int,
    cpu_tid: Any,
) -> None:
    """The catalogued ranges of ``rank`` overlapping the window, clipped, as annotations."""
    table = trace.ranges
    rows = np.concatenate([ranges.specific.rows, ranges.container.rows]).astype(np.int64)
    if len(rows) == 0:
        return
    rank_of = table["rank"][rows].astype(np.int64)
    unknown = rank_of < 0
    if unknown.any():
        rank_of[unknown] = [trace.ranks.get(int(p), -1) for p in table["process"][rows][unknown]]
    keep = rows[(rank_of == rank) & (table["start"][rows] < hi_w) & (table["end"][rows] > lo_w)]
    for r in np.sort(keep).tolist():
        lo, hi = max(int(table["start"][r]), lo_w), min(int(table["end"][r]), hi_w)
        helper = int(ranges.helper[r])
        slice_(
            trace.strings[int(table["name"][r])],
            "user_annotation",
            cpu_pid,
            cpu_tid(rank, int(table["thread"][r])),
            lo,
            hi,
            {
                "helper": att.name_of(helper),
                "category": att.category_of(helper).value,
                "rank": rank,
            },
        )


def _names(rank: int, gpu_pid: int, cpu_pid: int, streams: set[int]) -> list[dict[str, Any]]:
    meta: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": gpu_pid, "args": {"name": f"rank {rank} GPU"}},
        {"ph": "M", "name": "process_sort_index", "pid": gpu_pid, "args": {"sort_index": gpu_pid}},
        {"ph": "M", "name": "process_name", "pid": cpu_pid, "args": {"name": f"rank {rank} CPU"}},
        {"ph": "M", "name": "process_sort_index", "pid": cpu_pid, "args": {"sort_index": cpu_pid}},
        {
            "ph": "M",
            "name": "thread_name",
            "pid": gpu_pid,
            "tid": IDLE_TID,
            "args": {"name": "idle gaps (cptrace account)"},
        },
    ]
    meta += [
        {
            "ph": "M",
            "name": "thread_name",
            "pid": gpu_pid,
            "tid": s,
            "args": {"name": f"stream {s}"},
        }
        for s in sorted(streams)
    ]
    return meta


__all__ = ["IDLE_CATEGORY", "IDLE_TID", "ExportError", "perfetto_trace", "select_window"]
