"""Cross-rank alignment of collectives: when did the last rank reach each one.

A collective (or P2P exchange) cannot complete before every rank taking part has started its
kernel; the NCCL kernel of an early rank spins until then. The account calls the exposed part
of that spin "waiting on another rank".

Alignment: the normalized model carries no collective sequence numbers (the readers keep no
``record_param_comms`` arguments), so the k-th NCCL kernel of a (kernel name, n-th NCCL stream
of the rank) on one rank is matched with the k-th of the same key on every other rank, by start
order. A key whose kernel count differs between the ranks that have it is not aligned (a note
says so): a wrong alignment would invent waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from analyzers.model import Trace

IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class Arrivals:
    """Per GPU activity: when the last rank started the matching collective (-1: not aligned)
    and which rank that was."""

    last_start: IntArray
    last_rank: IntArray
    notes: list[str] = field(default_factory=list)


def _stream_ordinal(rank: IntArray, stream: IntArray, start: IntArray) -> IntArray:
    """Per row: the rank's n-th distinct stream, numbered by first use."""
    out = np.zeros(len(rank), dtype=np.int64)
    for r in np.unique(rank).tolist():
        rows = np.flatnonzero(rank == r)
        order = rows[np.argsort(start[rows], kind="stable")]
        streams, first = np.unique(stream[order], return_index=True)
        ordinal = np.argsort(np.argsort(first))  # per distinct stream: its rank of first use
        out[rows] = ordinal[np.searchsorted(streams, stream[rows])]
    return out


def arrivals(trace: Trace, rank: IntArray, communication: npt.NDArray[np.bool_]) -> Arrivals:
    """Align the NCCL kernels (``communication``) of all ranks; see the module docstring."""
    acts = trace.activities
    n = len(acts)
    out = Arrivals(np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
    rows = np.flatnonzero(communication & (rank >= 0))
    if len(rows) == 0 or len(np.unique(rank[rows])) < 2:
        return out
    start = acts["start"][rows].astype(np.int64)
    r = rank[rows]
    ordinal = _stream_ordinal(r, acts["stream"][rows].astype(np.int64), start)
    name = acts["name"][rows].astype(np.int64)
    for key_name in np.unique(name).tolist():
        for key_stream in np.unique(ordinal[name == key_name]).tolist():
            sel = np.flatnonzero((name == key_name) & (ordinal == key_stream))
            ranks = np.unique(r[sel])
            if len(ranks) < 2:
                continue
            per_rank = []
            for k in ranks:
                mine = sel[r[sel] == k]
                per_rank.append(mine[np.argsort(start[mine], kind="stable")])
            counts = {int(k): len(p) for k, p in zip(ranks, per_rank, strict=True)}
            if len(set(counts.values())) != 1:
                label = trace.strings[key_name].split("(")[0]
                out.notes.append(
                    f"{label} (NCCL stream #{key_stream} of each rank): kernel counts per rank "
                    f"{counts} differ, so its waits on other ranks are not attributed"
                )
                continue
            starts = np.stack([start[p] for p in per_rank])  # ranks x k
            latest = starts.argmax(axis=0)
            for p in per_rank:
                out.last_start[rows[p]] = starts.max(axis=0)
                out.last_rank[rows[p]] = ranks[latest]
    return out


__all__ = ["Arrivals", "arrivals"]
