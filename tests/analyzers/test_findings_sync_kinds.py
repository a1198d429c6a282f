"""Host-sync evidence counts blocking calls per API kind and sync operators per operator.

Issue 25, defect 5: "aten::_local_scalar_dense calls 20/step" was 20 blocking CUDA calls made
by 5 such operators; the two counts are kept apart now.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from testkit import DATA_DIR

from analyzers.pipeline import analyze, run_analysis

DATA = DATA_DIR
PID, TID = 100, 100


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def _item_trace(steps: int, ops: int, copies: int) -> dict[str, Any]:
    """``steps`` ProfilerSteps; each runs ``ops`` ``.item()`` ops, each of which makes
    ``copies`` D2H copies and one cudaStreamSynchronize."""
    events: list[dict[str, Any]] = []
    t, corr = 1000.0, 1
    for step in range(steps):
        start = t
        for _ in range(ops):
            events.append(_x("cpu_op", "aten::_local_scalar_dense", t, 10.0 * copies + 10))
            for k in range(copies):
                events.append(_x("cuda_runtime", "cudaMemcpyAsync", t + 1 + 10 * k, 8,
                                 correlation=corr))
                copy = _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 2 + 10 * k, 5,
                          device=0, stream=7, correlation=corr, bytes=4)
                copy["pid"], copy["tid"] = 0, 7
                events.append(copy)
                corr += 1
            events.append(
                _x("cuda_runtime", "cudaStreamSynchronize", t + 10 * copies + 1, 8,
                   correlation=corr)
            )
            corr += 1
            t += 10.0 * copies + 20
        events.append(_x("user_annotation", f"ProfilerStep#{step}", start - 1, t - start + 2))
        t += 50
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
            "traceEvents": events}


def test_blocking_calls_per_api_kind_and_ops_per_operator(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(_item_trace(steps=2, ops=5, copies=3)))
    report = analyze(path)
    (stat,) = [s for s in report.host_syncs if s.window == "ProfilerStep"]
    assert stat.calls == 2 * 5 * 4
    assert stat.apis == {"cudaMemcpyAsync": 2 * 5 * 3, "cudaStreamSynchronize": 2 * 5}
    assert stat.ops == {"aten::_local_scalar_dense": 2 * 5}
    (finding,) = [f for f in report.findings if f.rule == "host-sync-in-step"]
    cited = {e.name: e.value for e in finding.evidence}
    basis = "per step (total / 2 steps)"
    assert cited[f"blocking cudaMemcpyAsync calls {basis}"] == 15
    assert cited[f"blocking cudaStreamSynchronize calls {basis}"] == 5
    assert cited[f"aten::_local_scalar_dense calls that blocked {basis}"] == 5


def test_real_nsys_export_counts_each_sync_api_as_the_export_does(tmp_path: Path) -> None:
    """Plain CUDA program (tests/data/openworld): the per-kind counts equal an SQL count."""
    source = DATA / "openworld" / "nsys_plain_cuda.sqlite.gz"
    db = tmp_path / "t.sqlite"
    with gzip.open(source) as src, open(db, "wb") as out:
        shutil.copyfileobj(src, out)
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
            "ON s.id = r.nameId WHERE s.value LIKE 'cuda%Synchronize%' OR s.value LIKE "
            "'cudaMemcpy\\_%' ESCAPE '\\' OR s.value = 'cudaMemcpy' GROUP BY 1"
        ).fetchall()
    want = {name.split("_v")[0]: n for name, n in rows}
    (stat,) = run_analysis(source).report.host_syncs
    assert {k.split("_v")[0]: n for k, n in stat.apis.items()} == want
    assert stat.calls == sum(want.values()) and stat.ops == {}
