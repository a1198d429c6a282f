"""Trace readers: Nsight Systems exports and PyTorch profiler (Kineto) JSON -> ``Trace``.

``read_trace`` picks the reader from the file's content (gzip, SQLite and JSON magic), so a
misnamed upload still reads. ``read_traces`` reads a trace set (one nsys export covering all
ranks, or one Kineto file per rank) and merges it, refusing two files that claim one rank.

``check_trace`` is the upload check (structural and streaming, milliseconds; the full read is
the analysis'), ``sniff`` the one content sniffer the bundle reader and the service share.

A ``TraceInput`` is a trace file whose format is already known (a bundle's manifest, checked
against the content once; the service's stored run files): ``read_inputs`` reads it without
sniffing again. ``trace_input`` makes one from a bare path, sniffing it once.

Example::

    from analyzers.readers import read_traces
    trace = read_traces(["kineto_rank0.json.gz", "kineto_rank1.json.gz"])
    trace.rank_list()  # [0, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from analyzers.errors import MissingRankError, RankConflictError, TraceError, UnsupportedTraceError
from analyzers.model import Trace, merge_traces
from analyzers.readers._files import (
    DEFAULT_MAX_DECOMPRESSED,
    FORMAT_OF_KIND,
    GZIP_MAGIC,
    CappedGunzip,
    Kind,
    TraceFormat,
    decompressed_copy,
    inflated,
    is_gzip,
    open_maybe_gzip,
    sniff,
)
from analyzers.readers._ranks import rankless, resolve_ranks, take_listed_rank

if TYPE_CHECKING:
    from analyzers.readers.kineto import read_kineto, read_kineto_files
    from analyzers.readers.nsys import read_nsys

# The format readers load on first use (``__getattr__``): an analysis reads one or two formats,
# and in an environment that writes no bytecode every module imported is compiled from source
# on each run; the Kineto side, the nsys side and the upload check are each tens of ms of that.
_LAZY = {
    "read_kineto": "analyzers.readers.kineto",
    "read_kineto_files": "analyzers.readers.kineto",
    "read_nsys": "analyzers.readers.nsys",
}


def __getattr__(name: str) -> Callable[..., object]:
    """``read_kineto``, ``read_kineto_files``, ``read_nsys``: imported on first access."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found: Callable[..., object] = getattr(import_module(_LAZY[name]), name)
    globals()[name] = found
    return found


__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "FORMAT_OF_KIND",
    "GZIP_MAGIC",
    "CappedGunzip",
    "CheckedTrace",
    "Kind",
    "TraceFormat",
    "TraceInput",
    "check_trace",
    "give_listed_rank",
    "inflated",
    "is_gzip",
    "rankless",
    "read_input",
    "read_inputs",
    "read_kineto",
    "read_kineto_files",
    "read_nsys",
    "read_trace",
    "read_trace_files",
    "read_traces",
    "resolve_ranks",
    "sniff",
    "sniff_input",
    "trace_input",
]


@dataclass(frozen=True, slots=True)
class CheckedTrace:
    """What ``check_trace`` found: the sniffed kind, its trace format, and gzip or not."""

    kind: Kind
    gzipped: bool

    @property
    def format(self) -> TraceFormat | None:
        """``kineto`` or ``nsys``; None for a saved report."""
        return FORMAT_OF_KIND[self.kind]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceInput:
    """One trace file of an analysis, with what is already known about it.

    Callers that know the format (a bundle's manifest entry, checked against the content when
    the bundle was read; a stored run file) pass it so no layer sniffs the file again.
    """

    path: Path
    format: TraceFormat
    gzipped: bool
    rank: int | None = None
    """The rank the bundle lists for the file: given to a file that does not say its own."""
    label: str | None = None
    """The file's name in the report and in messages (e.g. ``run.tar.gz:traces/rank0.json``);
    None: the path."""

    @property
    def name(self) -> str:
        """``label`` or the path."""
        return self.label or str(self.path)


def trace_input(path: str | Path) -> TraceInput:
    """A bare path as a ``TraceInput``: its content sniffed once.

    Raises:
        UnsupportedTraceError: neither an nsys export nor Kineto JSON (a saved report too: the
            analysis accepts that as is, never as a trace to read).
        CorruptTraceError: an empty file or a damaged gzip stream.
    """
    found = sniff_input(path)
    if found is None:
        raise UnsupportedTraceError(
            f"{path}: is a saved cptrace report, not a trace (analyze and compare accept it as is)"
        )
    return found


def sniff_input(path: str | Path) -> TraceInput | None:
    """``trace_input``, or None for a saved report (sniffed once either way)."""
    source = Path(path)
    found = FORMAT_OF_KIND[sniff(source)]
    return None if found is None else TraceInput(path=source, format=found, gzipped=is_gzip(source))


def check_trace(
    path: str | Path,
    *,
    label: str | None = None,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED,
    kind: Kind | None = None,
    gzipped: bool | None = None,
) -> CheckedTrace:
    """The upload check of one file: is it a trace (or a saved report) worth analysing?

    Structural and streaming, never a whole-file parse: Kineto JSON is tokenized with strict
    grammar and a depth limit until ``traceEvents`` has shown its first events (all objects);
    an nsys export passes the readers' SQLite guard (no triggers, views, virtual tables) and
    has the tables the reader needs; a saved report is recognised by its first keys. The full
    read, and everything it checks, is the analysis'.

    Args:
        path: the file (gzipped or not; its name is only used for ``.nsys-rep``).
        label: the name messages use (the uploaded name, never a server path).
        max_bytes: decompression cap of gzip data (the readers' default unless given). A
            gzipped file is inflated to its end (``_files.inflated``, discarding what the
            check does not read), so the check and the readers accept the same gzip data.
        kind: what the file holds when the caller already sniffed it (the bundle reader does,
            to check the manifest's format): not sniffed again.
        gzipped: whether the file is gzip, when the caller knows (with ``kind``).

    Raises:
        UnsupportedTraceError: not a supported format, or a ``.nsys-rep`` (only ``nsys`` reads it).
        CorruptTraceError: invalid JSON, no ``traceEvents`` list of objects, truncated gzip,
            an SQLite file without the nsys tables.
        HostileTraceError: triggers, views, virtual tables or generated columns.
        TraceTooLargeError: the check's prefix or the decompression cap is exceeded.
    """
    from analyzers.readers._check import check_json_trace, sqlite_tables_ok

    source = Path(path)
    name = label or str(source)
    cap = max_bytes
    try:
        kind = sniff(source, label=name) if kind is None else kind
        gzipped = is_gzip(source) if gzipped is None else gzipped
        if kind == "json":
            with source.open("rb") as raw:
                stream, _ = open_maybe_gzip(raw, cap, label=name)
                check_json_trace(stream, label=name)
                if isinstance(stream, CappedGunzip):
                    stream.drain()
        elif kind == "sqlite" and gzipped:
            with decompressed_copy(source, cap) as plain:
                sqlite_tables_ok(plain, label=name)
        elif kind == "sqlite":
            sqlite_tables_ok(source, label=name)
        elif kind == "nsys-rep":
            raise UnsupportedTraceError(
                f"{name}: a .nsys-rep cannot be checked without Nsight Systems; send its SQLite "
                "export instead (nsys export --type sqlite)"
            )
    except TraceError as exc:
        if label is None or str(source) not in str(exc):
            raise
        raise type(exc)(str(exc).replace(str(source), name)) from exc
    return CheckedTrace(kind=kind, gzipped=gzipped)


def read_trace(
    path: str | Path,
    *,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> Trace:
    """Read one trace file of any supported format, chosen by content.

    ``rank`` sets the file's rank (``cptrace analyze --rank N``); a file that does not say its
    rank is rank 0, with a note. ``max_decompressed_bytes`` caps a gzipped file's expansion.

    Raises:
        UnsupportedTraceError: neither an nsys export nor Kineto JSON.
        CorruptTraceError, HostileTraceError: see the format readers.
    """
    trace = _read_one(Path(path), max_decompressed_bytes)
    resolve_ranks([trace], rank)
    return trace


def _read_one(source: Path, cap: int) -> Trace:
    return read_input(trace_input(source), max_decompressed_bytes=cap)


def read_input(
    item: TraceInput, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED
) -> Trace:
    """Read one file of a known format (no sniffing, no rank rule: see ``read_inputs``);
    ``max_decompressed_bytes`` caps a gzipped file's expansion."""
    if item.format == "kineto":
        from analyzers.readers.kineto import read_kineto

        return read_kineto(item.path, max_decompressed_bytes=max_decompressed_bytes)
    from analyzers.readers.nsys import read_nsys

    return read_nsys(item.path, gzipped=item.gzipped, max_decompressed_bytes=max_decompressed_bytes)


def give_listed_rank(trace: Trace, item: TraceInput) -> None:
    """The rank the file's bundle lists, where the file does not state its own (in place; see
    ``_ranks.take_listed_rank``)."""
    take_listed_rank(trace, item.rank, "the run bundle's manifest")


def read_trace_files(
    paths: Iterable[str | Path],
    *,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> list[Trace]:
    """Read each file like ``read_trace``, in order; several Kineto files (one per rank) may be
    read in parallel worker processes (``CPTRACE_READ_WORKERS``, see ``read_kineto_files``).

    ``rank`` applies to a single file only; several files that do not say their rank are an
    ``UnsupportedTraceError`` naming the ``--rank`` option (see ``_ranks.resolve_ranks``)."""
    return read_inputs(
        [trace_input(p) for p in paths], rank=rank, max_decompressed_bytes=max_decompressed_bytes
    )


def read_inputs(
    items: Sequence[TraceInput],
    *,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> list[Trace]:
    """``read_trace_files`` for files of known format: each read once, never sniffed."""
    cap = max_decompressed_bytes
    kineto = [item.path for item in items if item.format == "kineto"]
    if len(kineto) < 2:
        traces = [read_input(item, max_decompressed_bytes=cap) for item in items]
    else:
        from analyzers.readers.kineto import read_kineto_files

        parsed = iter(read_kineto_files(kineto, max_decompressed_bytes=cap))
        traces = [
            next(parsed)
            if item.format == "kineto"
            else read_input(item, max_decompressed_bytes=cap)
            for item in items
        ]
    for trace, item in zip(traces, items, strict=True):
        give_listed_rank(trace, item)
    resolve_ranks(traces, rank)
    return traces


def read_traces(
    paths: Iterable[str | Path], *, require_all_ranks: bool = False, rank: int | None = None
) -> Trace:
    """Read and merge a trace set.

    Args:
        paths: trace files; order does not matter.
        rank: the rank of a single file (see ``read_trace``).
        require_all_ranks: raise ``MissingRankError`` (instead of adding a note) when the
            traces announce a world size larger than the ranks given.

    Raises:
        RankConflictError: two Kineto files claim the same rank, or two files cover one rank.
        MissingRankError: ranks are missing and ``require_all_ranks`` is set.
    """
    items = [Path(p) for p in paths]
    if not items:
        raise ValueError("read_traces: no trace files given")
    traces = read_trace_files(items, rank=rank)
    _check_rank_conflicts(traces)
    merged = merge_traces(traces)
    _check_missing_ranks(traces, merged, require_all_ranks)
    return merged


def _check_rank_conflicts(traces: list[Trace]) -> None:
    claimed: dict[int, str] = {}
    for trace in traces:
        for rank in trace.rank_list():
            if rank < 0:
                continue
            if rank in claimed:
                raise RankConflictError(
                    f"{trace.source}: claims rank {rank}, already claimed by {claimed[rank]}; "
                    "expected one trace per rank (for Kineto, check distributedInfo.rank or "
                    "the rank<N> in the file names)"
                )
            claimed[rank] = trace.source


def _world_size(trace: Trace) -> int | None:
    info = trace.metadata.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("world_size"), int):
        return int(info["world_size"])
    return None


def _check_missing_ranks(traces: list[Trace], merged: Trace, strict: bool) -> None:
    sizes = [size for size in map(_world_size, traces) if size is not None]
    if not sizes:
        return
    world = max(sizes)
    missing = sorted(set(range(world)) - set(merged.rank_list()))
    if not missing:
        return
    message = (
        f"{merged.source}: distributedInfo.world_size is {world} but no trace covers rank(s) "
        f"{', '.join(map(str, missing))}: cross-rank comparisons cover the given ranks only"
    )
    if strict:
        raise MissingRankError(message)
    merged.notes.append(message)
