"""Per-rank analysis: each trace file read and attributed on its own, then one merge.

A run of R ranks is R files (one Kineto file per rank; an nsys export covering several
processes is one file, so one part). ``analyze_rank`` is the per-file stage: read, ranks,
catalog matches of the ranges, attribution of every activity. It runs in its own process
wherever the caller likes (the service runs R of them in parallel), and its result, a
``RankPart``, is written to a blob with ``dump_part``: the normalized columnar tables plus
the attribution columns, a fraction of the trace file's size. ``merge_parts`` loads the parts,
concatenates them exactly as ``merge_traces`` does (row offsets applied to the attribution's
row references), and runs the stages that need every rank (windows, metrics, accounts,
findings, the report) through the same code as the one-process analysis: the report is the
same, byte for byte (``tests/analyzers/test_rank_parts.py``).

What is bounded by one rank: the read (the parse of a file, the largest cost in time and
memory) and the attribution's temporaries. The merge holds every rank's tables.

Before / after of the merge's attribution (two parts, 3 and 2 activities, 4 and 3 launches,
5 ranges in the first part)::

    part 0: launch [0, 2, -1]  range_row [4, -1, 1]
    part 1: launch [1, 0]      range_row [0, 2]
    merged: launch [0, 2, -1, 5, 4]  range_row [4, -1, 1, 5, 7]   (-1 stays -1)
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzers.attribution import Attribution, RangeHelpers, attribute, index_ranges, match_ranges
from analyzers.catalog import Catalog, load_catalog
from analyzers.errors import CorruptTraceError
from analyzers.manifest import RunManifest
from analyzers.model import SymbolTable, Trace, adopt_dtypes, merge_traces
from analyzers.pipeline import (
    Analysis,
    Progress,
    _cycle_collector_paused,
    analyze_attributed,
    source_infos,
)
from analyzers.readers import (
    DEFAULT_MAX_DECOMPRESSED,
    TraceInput,
    give_listed_rank,
    rankless,
    read_input,
    resolve_ranks,
)

PART_VERSION = 1
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


def merge_parts(
    parts: Iterable[RankPart],
    *,
    manifest: RunManifest | None = None,
    step_pattern: str | None = None,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
    rank: int | None = None,
) -> Analysis:
    """The cross-rank stages over the parts of one run, in the run's file order.

    Pass the parts as a generator (``load_part`` of each blob) to let the merge drop each
    part's own tables once they are concatenated: the merge then holds the run's tables once.

    Raises:
        TraceError: no parts, two files claiming one rank, several files of which one does
            not say its rank (as the one-process analysis raises them).
    """
    from analyzers.errors import TraceError

    items = list(parts)
    if not items:
        raise TraceError("no trace files given")
    catalog = catalog or load_catalog()
    traces = [p.trace for p in items]
    if len(items) > 1:
        resolve_ranks(traces, rank)
    with _cycle_collector_paused():
        sources = source_infos(traces, [p.input for p in items])
        trace = merge_traces(traces)
        ranges, att = _merge_attribution(items, trace, catalog)
        del items, traces  # the parts' tables, now copied into the merged ones
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


def _merge_attribution(
    parts: Sequence[RankPart], trace: Trace, catalog: Catalog
) -> tuple[RangeHelpers, Attribution]:
    """The parts' matches and attributions as if made on the merged trace (row offsets)."""
    atts = [p.attribution for p in parts]
    if any(a is None for a in atts):  # resolve_ranks refused such a set already
        raise RuntimeError("a part without attribution reached the merge")
    launch, range_row = [], []
    launch_offset = range_offset = 0
    for part in parts:
        att = part.attribution
        assert att is not None
        launch.append(np.where(att.launch >= 0, att.launch + launch_offset, -1))
        range_row.append(np.where(att.range_row >= 0, att.range_row + range_offset, -1))
        launch_offset += len(part.trace.launches)
        range_offset += len(part.trace.ranges)
    ranges = index_ranges(
        trace,
        catalog,
        np.concatenate([p.range_helper for p in parts]).astype(np.int32, copy=False),
        np.concatenate([p.via_python for p in parts]).astype(bool, copy=False),
    )
    merged = Attribution(
        helper=np.concatenate([a.helper for a in atts if a is not None]),
        matched_by=np.concatenate([a.matched_by for a in atts if a is not None]),
        launch=np.concatenate(launch).astype(np.int64, copy=False),
        range_row=np.concatenate(range_row).astype(np.int64, copy=False),
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


def load_part(path: Path, catalog: Catalog | None = None) -> RankPart:
    """Read a part ``dump_part`` wrote.

    Raises:
        CorruptTraceError: not such a blob, or one of another layout version.
    """
    catalog = catalog or load_catalog()
    try:
        with np.load(path, allow_pickle=False) as blob:
            arrays = {name: blob[name] for name in blob.files}
        meta = json.loads(arrays.pop("meta").tobytes())
    except (OSError, ValueError, KeyError) as exc:
        raise CorruptTraceError(f"{path}: not a per-rank part ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("version") != PART_VERSION:
        raise CorruptTraceError(f"{path}: a per-rank part of another version")
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
    return RankPart(
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


__all__ = ["PART_VERSION", "RankPart", "analyze_rank", "dump_part", "load_part", "merge_parts"]
