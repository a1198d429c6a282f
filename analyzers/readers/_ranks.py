"""Which distributed rank a trace file is: what the file says, what the user says, or rank 0.

Why a rule and not a guess per file: a trace set whose ranks are guessed would compare the wrong
ranks, so several files without a rank are refused. One file without a rank is the most common
trace there is (one process, one GPU, no ``torch.distributed``): it is rank 0, and the report
says so. ``--rank N`` (``rank=`` here) names the rank of one file explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analyzers.errors import UnsupportedTraceError
from analyzers.model import Trace

RANK_OPTION = "--rank"
"""The CLI option that sets the rank of one file (named in messages)."""
UNKNOWN = "unknown"
"""``metadata["rank_source"]`` of a trace that does not say its rank."""
DEVICE_ORDER = "CUDA device order (each process used one device)"
PROCESS_ORDER = "process order (first kernel start)"
"""``rank_source`` of an nsys export, whose ranks are numbered from its own processes (by the
device each drove, or by first kernel): not a rank the file states, so a one-process export of
a per-rank bundle claims rank 0 whatever rank it is."""
INFERRED = frozenset({DEVICE_ORDER, PROCESS_ORDER})


def set_rank(trace: Trace, rank: int, source: str) -> None:
    """Make every row and process of a one-rank trace belong to ``rank``.

    The GPU annotations too: a step window is measured over its ``gpu_user_annotation`` only
    when both carry the same rank, so leaving them behind measured single-process Kineto steps
    over the CPU range (issue 25, defect 1).
    """
    processes = set(trace.ranks)
    for table in (trace.activities, trace.launches, trace.ranges):
        table["rank"] = rank
        processes.update(int(p) for p in np.unique(table["process"]))
    trace.gpu_ranges["rank"] = rank
    trace.ranks = dict.fromkeys(sorted(processes), rank)
    trace.metadata["rank_source"] = source


def resolve_ranks(traces: Sequence[Trace], rank: int | None = None) -> None:
    """Give every trace a rank, in place.

    Args:
        traces: the files of one trace set, as read.
        rank: the rank the user gave for a single file (``--rank N``), or None.

    Raises:
        UnsupportedTraceError: ``rank`` given for several files or for a file covering several
            processes' ranks; several files of which some do not say their rank.
    """
    if rank is not None:
        _override(traces, rank)
        return
    unknown = [t for t in traces if rankless(t)]
    if not unknown:
        return
    if len(traces) > 1:
        names = ", ".join(t.source for t in unknown[:3])
        raise UnsupportedTraceError(
            f"{names}: cannot tell the rank of {len(unknown)} of {len(traces)} trace files (no "
            "distributedInfo.rank in the trace, no 'rank<N>' in the file name); name the files "
            f"trace_rank<N>.json, or analyse one file at a time with {RANK_OPTION} N"
        )
    (trace,) = traces
    set_rank(trace, 0, "assumed (a single file without a rank)")
    trace.notes.append(
        f"{trace.source}: the trace does not say its rank (no distributedInfo.rank, no "
        f"'rank<N>' in the file name): analysed as rank 0; pass {RANK_OPTION} N to set it"
    )


def take_listed_rank(trace: Trace, listed: int | None, source: str) -> None:
    """The rank a bundle's manifest lists for a file becomes the file's rank (in place) when
    the file does not say its rank, or when it is a one-process nsys export, whose rank 0 is
    only its own process numbering (one export per rank: each would claim rank 0). A file that
    states its rank (Kineto's ``distributedInfo``, a ``rank<N>`` name) keeps it; an export of
    several processes keeps its own numbering (the manifest lists no rank for it)."""
    if listed is None:
        return
    if rankless(trace):
        set_rank(trace, listed, source)
        return
    present = [r for r in trace.rank_list() if r >= 0]
    if trace.metadata.get("rank_source") in INFERRED and len(present) == 1 and present != [listed]:
        set_rank(trace, listed, source)


def rankless(trace: Trace) -> bool:
    """The file does not say its rank (a Kineto file without one, an nsys export without GPU
    activity, whose ranks come from the devices its processes used)."""
    if trace.metadata.get("rank_source") == UNKNOWN:
        return True
    return all(r < 0 for r in trace.rank_list())


def _override(traces: Sequence[Trace], rank: int) -> None:
    if rank < 0:
        raise UnsupportedTraceError(f"{RANK_OPTION} {rank}: expected a rank >= 0")
    if len(traces) != 1:
        raise UnsupportedTraceError(
            f"{RANK_OPTION} {rank} sets the rank of one trace file, but {len(traces)} were "
            "given; analyse them one at a time, or let each file say its rank"
        )
    (trace,) = traces
    present = [r for r in trace.rank_list() if r >= 0]
    if len(present) > 1:
        raise UnsupportedTraceError(
            f"{trace.source}: {RANK_OPTION} {rank} sets the rank of a one-rank trace, but this "
            f"file covers ranks {present} (one nsys export of several processes)"
        )
    set_rank(trace, rank, f"{RANK_OPTION} {rank}")
