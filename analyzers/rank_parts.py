"""Per-rank analysis: each trace file read and attributed on its own, then one merge.

A run of R ranks is R files (one Kineto file per rank; an nsys export covering several
processes is one file, so one part). ``analyze_rank`` is the per-file stage: read, ranks,
catalog matches of the ranges, attribution of every activity. It runs in its own process
wherever the caller likes (the service runs R of them in parallel), and its result, a
``RankPart``, is written to a blob with ``dump_part``: the normalized columnar tables plus
the attribution columns, a fraction of the trace file's size, and a header of their row counts.
``merge_part_blobs`` reads the headers, allocates the run's tables once, and loads the parts
one at a time into them (``merge_traces`` with row counts; row offsets applied to the
attribution's row references), each part let go before the next is loaded; then it runs the
stages that need every rank (windows, metrics, accounts, findings, the report) through the same
code as the one-process analysis: the report is the same, byte for byte
(``tests/analyzers/test_rank_parts.py``).

What is bounded by one rank: the read (the parse of a file, the largest cost in time and
memory), the attribution's temporaries, and what the merge holds of a part while it copies it.
What is not: the merged tables (about a third of the merge's peak), the report's own content
(every rank's drawn timeline events, accounts and summaries, held as models until the report
is built: about as much again) and the stages' temporaries over the tables; the largest of
these (the account's host-state indexes, the summary's per-range sums) are built per block of
whole threads or of rows, a bounded size. To bound the merge by one rank the stages must run
per rank and leave summaries, and the report must not be held whole; the one figure that
needs every rank's kernels is the kernel table's all-ranks row (median and standard deviation
of each kernel name over every rank's instances, computed over the sorted durations: exact
bytes need those durations, 8 bytes a kernel, not a sketch).

Before / after of the merge's attribution (two parts, 3 and 2 activities, 4 and 3 launches,
5 ranges in the first part)::

    part 0: launch [0, 2, -1]  range_row [4, -1, 1]
    part 1: launch [1, 0]      range_row [0, 2]
    merged: launch [0, 2, -1, 5, 4]  range_row [4, -1, 1, 5, 7]   (-1 stays -1)
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzers.attribution import Attribution, RangeHelpers, attribute, index_ranges, match_ranges
from analyzers.catalog import Catalog, load_catalog
from analyzers.errors import CorruptTraceError, TraceError
from analyzers.manifest import RunManifest
from analyzers.model import (
    SymbolTable,
    TableRows,
    Trace,
    adopt_dtypes,
    merge_traces,
    table_rows,
)
from analyzers.pipeline import (
    Analysis,
    Progress,
    _cycle_collector_paused,
    analyze_attributed,
    source_info,
)
from analyzers.readers import (
    DEFAULT_MAX_DECOMPRESSED,
    TraceInput,
    give_listed_rank,
    rankless,
    read_input,
    resolve_ranks,
)
from analyzers.report import SourceInfo

PART_VERSION = 2
"""Version of the blob layout ``dump_part`` writes; ``load_part`` refuses any other."""


@dataclass(slots=True)
class RankPart:
    """One file read and attributed: what a per-rank stage hands the merge."""

    input: TraceInput
    trace: Trace
    range_helper: npt.NDArray[np.int32]
    """Per range row: the catalog helper it matched (-1: none)."""
    via_python: npt.NDArray[np.bool_]
    """Per range row: matched by a Python-frame pattern."""
    attribution: Attribution | None
    """None when the file does not say its rank and other files come with it: the merge
    refuses the set (``resolve_ranks``), naming every such file."""


def analyze_rank(
    item: TraceInput,
    *,
    files: int,
    catalog: Catalog | None = None,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> RankPart:
    """The per-file stage: read ``item``, give it its rank, attribute it.

    Args:
        item: the file, format known (not sniffed again).
        files: how many files the run has (the rank rule of one file differs: rank 0).
        catalog: the helper catalog (default: ``load_catalog()``).
        rank: the rank of the run's one file, when the user gives it (``--rank N``).
        max_decompressed_bytes: the most a gzipped file may expand to.

    Raises:
        TraceError: the file cannot be read (see ``analyzers.readers``).
    """
    catalog = catalog or load_catalog()
    with _cycle_collector_paused():
        trace = read_input(item, max_decompressed_bytes=max_decompressed_bytes)
        give_listed_rank(trace, item)
        if files == 1:
            resolve_ranks([trace], rank)
        elif rankless(trace):
            empty = np.empty(0, dtype=np.int32)
            return RankPart(item, trace, empty, np.empty(0, dtype=bool), None)
        ranges = match_ranges(trace, catalog)
        att = attribute(trace, catalog, ranges)
    return RankPart(item, trace, ranges.helper, ranges.via_python, att)


@dataclass(frozen=True, slots=True)
class PartHeader:
    """What the merge needs of a part before its tables: their sizes, and whether it was
    attributed (a part that was not makes the merge refuse the set)."""

    rows: TableRows
    attributed: bool


def part_header(part: RankPart) -> PartHeader:
    return PartHeader(table_rows(part.trace), part.attribution is not None)


def merge_parts(
    parts: Iterable[RankPart],
    *,
    headers: Sequence[PartHeader] | None = None,
    manifest: RunManifest | None = None,
    step_pattern: str | None = None,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
    rank: int | None = None,
) -> Analysis:
    """The cross-rank stages over the parts of one run, in the run's file order.

    With ``headers`` (each part's, in order: ``read_part_header`` of its blob) ``parts`` may
    be a generator (``load_part`` of each blob): each part is copied into the merged tables and
    let go before the next is loaded, so the merge holds the run's tables once and one part.
    Without, the parts are taken as a list.

    Raises:
        TraceError: no parts, two files claiming one rank, several files of which one does
            not say its rank (as the one-process analysis raises them).
    """
    catalog = catalog or load_catalog()
    if headers is None:
        items = list(parts)
        headers = [part_header(p) for p in items]
        parts = items
    if not headers:
        raise TraceError("no trace files given")
    if len(headers) > 1 and (rank is not None or not all(h.attributed for h in headers)):
        # resolve_ranks refuses such a set, naming its files: they are needed, so load them
        resolve_ranks([p.trace for p in parts], rank)
        raise RuntimeError("resolve_ranks accepted a set the merge cannot merge")
    with _cycle_collector_paused():
        merged = _MergedAttribution(headers, catalog)
        sources: list[SourceInfo] = []
        claimed: dict[int, str] = {}

        def traces() -> Iterator[Trace]:
            index = -1
            for part in parts:  # not enumerate(): its cached result would hold the last part
                index += 1
                if index >= len(headers) or part_header(part) != headers[index]:
                    raise RuntimeError(f"{part.input.path}: part differs from its header")
                sources.append(source_info(part.trace, part.input, claimed))
                merged.add(part)
                yield part.trace
                del part  # before the next part is loaded, not after

        trace = merge_traces(traces(), [h.rows for h in headers])
        ranges, att = merged.result(trace)
        return analyze_attributed(
            trace,
            ranges,
            att,
            manifest=manifest,
            step_pattern=step_pattern,
            catalog=catalog,
            sources=sources,
            progress=progress,
        )


def merge_part_blobs(
    blobs: Sequence[Path],
    *,
    manifest: RunManifest | None = None,
    catalog: Catalog | None = None,
) -> Analysis:
    """``merge_parts`` of the parts ``dump_part`` wrote to ``blobs``, loaded one at a time."""
    catalog = catalog or load_catalog()
    headers = [read_part_header(b) for b in blobs]
    parts = (load_part(b, catalog) for b in blobs)
    return merge_parts(parts, headers=headers, manifest=manifest, catalog=catalog)


class _MergedAttribution:
    """The parts' range matches and attributions as if made on the merged trace: row
    references offset by the rows of the parts before (see the module's example), written
    part by part into columns allocated once."""

    def __init__(self, headers: Sequence[PartHeader], catalog: Catalog) -> None:
        self._catalog = catalog
        acts = sum(h.rows[0] for h in headers)
        ranges = sum(h.rows[2] for h in headers)
        self._helper = np.empty(acts, dtype=np.int32)
        self._matched_by = np.empty(acts, dtype=np.int8)
        self._launch = np.empty(acts, dtype=np.int64)
        self._range_row = np.empty(acts, dtype=np.int64)
        self._range_helper = np.empty(ranges, dtype=np.int32)
        self._via_python = np.empty(ranges, dtype=bool)
        self._acts = self._launches = self._ranges = 0

    def add(self, part: RankPart) -> None:
        att = part.attribution
        if att is None:  # merge_parts refused such a set already
            raise RuntimeError("a part without attribution reached the merge")
        here = slice(self._acts, self._acts + len(part.trace.activities))
        self._helper[here] = att.helper
        self._matched_by[here] = att.matched_by
        self._launch[here] = np.where(att.launch >= 0, att.launch + self._launches, -1)
        self._range_row[here] = np.where(att.range_row >= 0, att.range_row + self._ranges, -1)
        rows = slice(self._ranges, self._ranges + len(part.trace.ranges))
        self._range_helper[rows] = part.range_helper
        self._via_python[rows] = part.via_python
        self._acts = here.stop
        self._launches += len(part.trace.launches)
        self._ranges = rows.stop

    def result(self, trace: Trace) -> tuple[RangeHelpers, Attribution]:
        catalog = self._catalog
        ranges = index_ranges(trace, catalog, self._range_helper, self._via_python)
        merged = Attribution(
            helper=self._helper,
            matched_by=self._matched_by,
            launch=self._launch,
            range_row=self._range_row,
            helper_names=tuple(h.name for h in catalog.helpers),
            categories=tuple(h.category for h in catalog.helpers),
        )
        return ranges, merged


_TABLES = ("activities", "launches", "ranges", "gpu_ranges")
_ATT = ("helper", "matched_by", "launch", "range_row")


def dump_part(part: RankPart, path: Path) -> int:
    """Write ``part`` to ``path`` (numpy ``.npz``: no pickle); returns the bytes written.

    Raises:
        TypeError: the trace's metadata holds a value JSON cannot carry unchanged (a tuple,
            a non-string key): refused rather than merged into a report that would differ.
    """
    trace = part.trace
    meta = {
        "version": PART_VERSION,
        "input": {
            "path": str(part.input.path),
            "format": part.input.format,
            "gzipped": part.input.gzipped,
            "rank": part.input.rank,
            "label": part.input.label,
        },
        "source": trace.source,
        "format": trace.format,
        "strings": trace.strings.names,
        "full_lengths": [[k, v] for k, v in trace.strings.full_lengths.items()],
        "ranks": [[k, v] for k, v in trace.ranks.items()],
        "thread_names": [[k, v] for k, v in trace.thread_names.items()],
        "span": list(trace.span),
        "notes": trace.notes,
        "metadata": trace.metadata,
        "attributed": part.attribution is not None,
        "rows": list(table_rows(trace)),
    }
    text = json.dumps(meta)
    if json.loads(text)["metadata"] != trace.metadata:
        raise TypeError(f"{trace.source}: trace metadata does not survive JSON unchanged")
    arrays: dict[str, Any] = {name: getattr(trace, name) for name in _TABLES}
    arrays["range_helper"] = part.range_helper
    arrays["via_python"] = part.via_python
    if part.attribution is not None:
        arrays.update({f"att_{name}": getattr(part.attribution, name) for name in _ATT})
    arrays["meta"] = np.frombuffer(text.encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    path.write_bytes(data)
    return len(data)


def read_part_header(path: Path) -> PartHeader:
    """The header of a part ``dump_part`` wrote, without loading its tables.

    Raises:
        CorruptTraceError: not such a blob, or one of another layout version.
    """
    meta = _read_meta(path)
    try:
        rows = tuple(int(n) for n in meta["rows"])
        if len(rows) != 4 or min(rows) < 0:
            raise ValueError(f"rows {rows}")
        return PartHeader((rows[0], rows[1], rows[2], rows[3]), bool(meta["attributed"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptTraceError(f"{path}: a damaged per-rank part ({exc!r})") from exc


def _read_meta(path: Path) -> dict[str, Any]:
    """The part's JSON member alone (an ``.npz`` member is read only when asked for)."""
    try:
        with np.load(path, allow_pickle=False) as blob:
            meta = json.loads(blob["meta"].tobytes())
    except (OSError, ValueError, KeyError) as exc:
        raise CorruptTraceError(f"{path}: not a per-rank part ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("version") != PART_VERSION:
        raise CorruptTraceError(f"{path}: a per-rank part of another version")
    return meta


def load_part(path: Path, catalog: Catalog | None = None) -> RankPart:
    """Read a part ``dump_part`` wrote.

    Raises:
        CorruptTraceError: not such a blob, or one of another layout version.
    """
    catalog = catalog or load_catalog()
    meta = _read_meta(path)
    try:
        with np.load(path, allow_pickle=False) as blob:
            arrays = {name: blob[name] for name in blob.files if name != "meta"}
    except (OSError, ValueError, KeyError) as exc:
        raise CorruptTraceError(f"{path}: not a per-rank part ({exc})") from exc
    try:
        return _part(meta, arrays, catalog)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptTraceError(f"{path}: a damaged per-rank part ({exc!r})") from exc


def _part(meta: dict[str, Any], arrays: dict[str, Any], catalog: Catalog) -> RankPart:
    item = meta["input"]
    trace = adopt_dtypes(
        Trace(
            source=meta["source"],
            format=meta["format"],
            strings=SymbolTable.from_names(
                meta["strings"], {int(k): int(v) for k, v in meta["full_lengths"]}
            ),
            activities=arrays["activities"],
            launches=arrays["launches"],
            ranges=arrays["ranges"],
            gpu_ranges=arrays["gpu_ranges"],
            ranks={int(k): int(v) for k, v in meta["ranks"]},
            thread_names={int(k): str(v) for k, v in meta["thread_names"]},
            span=(int(meta["span"][0]), int(meta["span"][1])),
            notes=list(meta["notes"]),
            metadata=dict(meta["metadata"]),
        )
    )
    att = None
    if meta["attributed"]:
        att = Attribution(
            helper=arrays["att_helper"],
            matched_by=arrays["att_matched_by"],
            launch=arrays["att_launch"],
            range_row=arrays["att_range_row"],
            helper_names=tuple(h.name for h in catalog.helpers),
            categories=tuple(h.category for h in catalog.helpers),
        )
    part = RankPart(
        input=TraceInput(
            path=Path(item["path"]),
            format=item["format"],
            gzipped=bool(item["gzipped"]),
            rank=item["rank"],
            label=item["label"],
        ),
        trace=trace,
        range_helper=arrays["range_helper"],
        via_python=arrays["via_python"],
        attribution=att,
    )
    _check_rows(part, meta["rows"])
    return part


def _check_rows(part: RankPart, rows: Sequence[int]) -> None:
    """The part's columns have the rows its header says (the merge allocates by the header)."""
    acts, ranges = len(part.trace.activities), len(part.trace.ranges)
    if list(table_rows(part.trace)) != list(rows):
        raise ValueError(f"tables of {table_rows(part.trace)} rows, header says {rows}")
    columns = [len(part.range_helper), len(part.via_python)]
    expected = [0, 0]  # a part left unattributed (its rank unknown) has no matches either
    if part.attribution is not None:
        att = part.attribution
        columns += [len(att.helper), len(att.matched_by), len(att.launch), len(att.range_row)]
        expected = [ranges, ranges, acts, acts, acts, acts]
    if columns != expected:
        raise ValueError(f"match and attribution columns of {columns} rows, expected {expected}")


__all__ = [
    "PART_VERSION",
    "PartHeader",
    "RankPart",
    "analyze_rank",
    "dump_part",
    "load_part",
    "merge_part_blobs",
    "merge_parts",
    "read_part_header",
]
