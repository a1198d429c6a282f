"""What blocks a CPU thread on the GPU: one definition for the metrics and the account.

Three kinds, each named by the catalog (``Catalog.is_sync``):

- a synchronising API call the reader kept (``cudaStreamSynchronize``, ``cudaMemcpy``), from
  its launch row;
- the launch of a device-to-host copy (into pageable memory it blocks the host until the copy
  is done), which blocks until the later of its return and the copy's end;
- a CPU operator range naming a sync (``aten::_local_scalar_dense``, behind ``.item()``).

The metrics' host-sync table (``HostSyncStat``) counts them per helper; the account labels
the idle time they cause ("idle: synchronisation"). Built once per trace by ``host_syncs`` in
the metrics and handed to the account.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzers.attribution import Attribution, RangeIndex, symbol_table
from analyzers.catalog import Catalog
from analyzers.model import ActivityKind, RangeKind, Trace

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class HostSyncs:
    """A trace's blocking calls and sync operator ranges."""

    op_ranges: RangeIndex
    """CPU operator ranges naming a sync op (rows of ``trace.ranges``)."""
    calls: IntArray
    """Launch rows, ascending: the sync API calls and the launches of blocking D2H copies."""
    label: IntArray
    """Per call: the symbol naming it, the API's, or the copy's name for a copy's launch."""
    end: IntArray
    """Per call: when it stops blocking, its return or, for a copy's launch, the copy's end
    when that is later."""


def host_syncs(trace: Trace, catalog: Catalog, att: Attribution) -> HostSyncs:
    """The blocking calls and sync operator ranges of ``trace`` (see the module docstring)."""
    launches, acts = trace.launches, trace.activities
    api = np.ascontiguousarray(launches["api"])  # counted and gathered from: one strided pass
    api_rows = np.flatnonzero(_symbols(trace, api, lambda n: catalog.is_sync("apis", n))[api])
    rows = api_rows.astype(np.int64)
    extended = np.empty(0, dtype=np.int64)  # launch rows of blocking device-to-host copies
    copy_name = copy_end = extended
    copies = np.flatnonzero(acts["kind"] == ActivityKind.MEMCPY)
    if len(copies):
        names = acts["name"][copies]
        sync = _symbols(trace, names, lambda n: catalog.is_sync("memcpy", n))
        d2h = copies[sync[names] & (att.launch[copies] >= 0)]
        extended = att.launch[d2h].astype(np.int64)
        copy_name = acts["name"][d2h].astype(np.int64)
        copy_end = acts["end"][d2h].astype(np.int64)
        rows = np.union1d(rows, extended)
    # the copy names the call (after the API), a blocking copy's call lasts until it ends
    label = np.empty(len(rows), dtype=np.int64)
    label[np.searchsorted(rows, api_rows)] = api[api_rows]
    label[np.searchsorted(rows, extended)] = copy_name
    ends = launches["end"][rows].astype(np.int64)
    np.maximum.at(ends, np.searchsorted(rows, extended), copy_end)
    return HostSyncs(_sync_op_ranges(trace, catalog), rows, label, ends)


def _sync_op_ranges(trace: Trace, catalog: Catalog) -> RangeIndex:
    table = trace.ranges
    names = np.ascontiguousarray(table["name"])
    sync_op = _symbols(trace, names, lambda n: catalog.is_sync("ops", n))[names]
    rows = np.flatnonzero(sync_op & (table["kind"] == RangeKind.CPU_OP)).astype(np.int64)
    r = table[rows]
    return RangeIndex(r["thread"], r["start"], r["end"], rows)


def _symbols(trace: Trace, column: npt.NDArray[np.int32], keep: Callable[[str], bool]) -> BoolArray:
    """Per symbol id (plus a trailing False): whether the name passes ``keep``, asked once
    for each symbol that occurs in ``column``."""
    table = symbol_table(column, len(trace.strings), lambda s: int(keep(trace.strings[s])))
    return np.append(table > 0, False)


__all__ = ["HostSyncs", "host_syncs"]
