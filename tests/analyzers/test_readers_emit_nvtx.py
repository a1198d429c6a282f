"""``emit_nvtx`` labels lose their per-call numbers, so calls and runs line up (issue 25,
defect 6). The real single-process nsys export of ``tests/data/synthetic-h200x2``, its NVTX
ranges relabelled the way ``torch.autograd.profiler.emit_nvtx`` writes them."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import numpy as np
from testkit import DATA_DIR

from analyzers.model import RangeKind
from analyzers.readers import read_trace
from analyzers.readers._nsys_ranges import emit_nvtx_label

SINGLE = DATA_DIR / "synthetic-h200x2" / "nsys_single.sqlite.gz"


def _relabelled(tmp_path: Path) -> Path:
    db = tmp_path / "emit_nvtx.sqlite"
    with gzip.open(SINGLE) as src, open(db, "wb") as out:
        shutil.copyfileobj(src, out)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE NVTX_EVENTS SET textId = NULL, text = printf('aten::mm, seq = %d, "
            "op_id = %d, sizes = [[4096, 4096], [4096, 4096]], input_op_ids = [(%d, 0)]', "
            "rowid, rowid + 1000, rowid + 999) WHERE eventType = 59"
        )
    return db


def test_emit_nvtx_ranges_share_one_name_per_op_and_shape(tmp_path: Path) -> None:
    trace = read_trace(_relabelled(tmp_path))
    nvtx = trace.ranges[trace.ranges["kind"] == RangeKind.NVTX]
    names = {trace.strings[int(s)] for s in np.unique(nvtx["name"])}
    assert names == {"aten::mm, sizes = [[4096, 4096], [4096, 4096]]"}
    assert len(nvtx) == 40  # every range kept, 20 inline and 20 registered names before


def test_emit_nvtx_label_keeps_names_without_counters() -> None:
    assert emit_nvtx_label("aten::add_, seq = 7, op_id = 9") == "aten::add_"
    assert emit_nvtx_label("aten::mm, op_id = 9, sizes = [[2, 2]]") == "aten::mm, sizes = [[2, 2]]"
    for plain in ("get_cu_seqlens_on_cp_rank", "step 3", "a, b = 1"):
        assert emit_nvtx_label(plain) == plain
