"""``benchmarks/make_large_nsys.py --ranks R``: a synthetic run of R ranks whose reader ranks
are the ranks it was built as (the reader numbers an export's ranks by CUDA device order:
rank r must be the process on device r, the r // 2-th copy of the real pair)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analyzers.model import ActivityKind
from analyzers.readers import read_trace
from tests.testkit import REPO_ROOT, script_module

make_large_nsys = script_module(REPO_ROOT / "benchmarks" / "make_large_nsys.py")


def test_a_synthetic_run_numbers_its_ranks_by_copy_and_device(tmp_path: Path) -> None:
    source = read_trace(make_large_nsys.DEFAULT_SOURCE)
    out = tmp_path / "ranks6.sqlite"
    kernels = make_large_nsys.build(make_large_nsys.DEFAULT_SOURCE, out, 1, ranks=6)
    trace = read_trace(out)
    assert trace.metadata["rank_source"] == "CUDA device order (each process used one device)"
    assert trace.rank_list() == list(range(6))
    acts, base = trace.activities, source.activities
    assert kernels == 3 * int((base["kind"] == ActivityKind.KERNEL).sum())
    step = make_large_nsys.PID_STEP << 24
    for rank in range(6):
        mine, theirs = acts[acts["rank"] == rank], base[base["rank"] == rank % 2]
        assert np.unique(mine["device"]).tolist() == [rank]
        assert np.unique(mine["process"]).tolist() == [
            int(np.unique(theirs["process"])[0]) + rank // 2 * step
        ]
        # the same work at the same instants as the rank it copies
        assert np.array_equal(np.sort(mine["start"]), np.sort(theirs["start"]))
    launches = trace.launches
    assert len(launches) == 3 * len(source.launches)
    assert len(trace.ranges) == 3 * len(source.ranges)
