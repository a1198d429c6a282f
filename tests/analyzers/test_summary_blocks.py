"""The summary's operator tables read the range table block by block (``ROW_BLOCK``): the same
rows, sums and order as one pass over every row (the formula before the blocks), on the real
open-world SDPA trace (nested CPU ops with Python frames: children in other blocks than their
parents) with blocks of a few rows."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from testkit import DATA_DIR

from analyzers.attribution import match_ranges
from analyzers.catalog import load_catalog
from analyzers.findings.summary import TOP_ROWS, _top, _uncatalogued
from analyzers.model import RangeKind, Trace
from analyzers.readers import read_trace
from analyzers.report import OpRow

SDPA = DATA_DIR / "openworld" / "kineto_sdpa_single_gpu.json.gz"


def _one_pass(trace: Trace, mask: npt.NDArray[np.bool_], by_self: bool) -> list[OpRow]:
    table = trace.ranges
    duration = (table["end"] - table["start"]).astype(np.int64)
    inner = np.zeros(len(table), dtype=np.int64)
    child = np.flatnonzero(table["parent"] >= 0)
    np.add.at(inner, table["parent"][child], duration[child])
    rows = np.flatnonzero(mask)
    unique, inverse = np.unique(table["name"][rows].astype(np.int64), return_inverse=True)
    inclusive = np.bincount(inverse, weights=duration[rows], minlength=len(unique))
    own = np.maximum(duration - inner, 0)[rows]
    self_ns = np.bincount(inverse, weights=own, minlength=len(unique))
    calls = np.bincount(inverse, minlength=len(unique))
    order = np.argsort(-(self_ns if by_self else inclusive), kind="stable")[:TOP_ROWS]
    return [
        OpRow(
            name=trace.strings[int(unique[i])],
            calls=int(calls[i]),
            inclusive_ns=int(inclusive[i]),
            self_ns=int(self_ns[i]),
        )
        for i in order.tolist()
    ]


@pytest.mark.parametrize("block", [1, 7, 1000, 1 << 30])
def test_top_rows_block_by_block_are_one_pass(block: int) -> None:
    trace = read_trace(SDPA)
    assert int((trace.ranges["parent"] >= 0).sum()) > 1000
    ranges = match_ranges(trace, load_catalog(use_env=False))
    ops = trace.ranges["kind"] == RangeKind.CPU_OP
    for mask, by_self in ((ops, True), (_uncatalogued(trace, ranges), False)):
        found = _top(trace, mask, by_self=by_self, block=block)
        assert found and found == _one_pass(trace, mask, by_self)
