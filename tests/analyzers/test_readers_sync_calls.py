"""Host-synchronising API calls are read (marked ``sync``), never counted as launches, and the
step account labels the GPU idle time they block as synchronisation.

Expected values come from the raw rows, walked in the test: plain ``sqlite3`` over the nsys
exports and a plain JSON walk over the Kineto files. The synchronisation idle of every window is
computed with the account's rule as ``test_account_real`` states it (``_helper_idle``: a gap is
host-caused when the launch of the activity that ends it had not returned when the gap began;
each instant counts at ``min(t, cut - 1)``) over the launching thread's sync intervals: the
synchronising API calls (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, a synchronous
``cudaMemcpy``, ...), device-to-host copies from their launch to the copy's end, and sync
operators (``aten::item``, ...).
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import tempfile
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from testkit import DATA_DIR

from analyzers.model import launch_calls
from analyzers.pipeline import Analysis, run_analysis
from analyzers.readers import read_trace
from analyzers.report import AccountPartKind as K
from tests.analyzers.test_account_real import Interval, _disjoint, _helper_idle

DATA = DATA_DIR
NSYS = [
    DATA / "openworld" / "nsys_plain_cuda.sqlite.gz",
    DATA / "openworld" / "nsys_sdpa_single_gpu.sqlite.gz",
    DATA / "synthetic-h200x2" / "nsys_single.sqlite.gz",
]
KINETO = [
    DATA / "openworld" / "kineto_sdpa_single_gpu.json.gz",
    DATA / "openworld" / "kineto_nccl_world1.json.gz",
    DATA / "synthetic-h200x2" / "kineto_rank0.json.gz",
    DATA / "te-2.20.2-h200x2" / "kineto_3arms_rank0.json.gz",
]
SYNC_API = re.compile(
    r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cuStreamSynchronize"
    r"|cuCtxSynchronize)"
)
"""The synchronising calls of the catalog's [host_sync] apis (besides ``cudaMemcpy``)."""
LAUNCH_API = re.compile(
    r"^(cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch|cudaMemcpy|"
    r"cudaMemset|cuMemcpy|cuMemset)"
)
SYNC_OPS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero"}


def _api(name: str) -> str:
    return re.sub(r"_v\d+$", "", name)


def _blocks_host(api: str) -> bool:
    """The catalog's [host_sync] apis: the sync calls, a synchronous cudaMemcpy."""
    return bool(SYNC_API.match(api)) or api == "cudaMemcpy" or api.startswith("cudaMemcpy_")


def _is_launch(api: str) -> bool:
    return bool(LAUNCH_API.match(api)) and "HostFunc" not in api


class Raw:
    """What the account needs, from the raw rows of one single-process trace."""

    def __init__(self) -> None:
        self.syncs: Counter[str] = Counter()  # sync API name -> calls
        self.launch_calls = 0
        self.activities: list[tuple[int, int, object]] = []  # start, end, launch key
        self.launches: dict[object, tuple[int, int, int]] = {}  # key -> start, end, thread
        self.blocked: dict[int, list[Interval]] = defaultdict(list)  # thread -> sync intervals

    def sync_idle(self, window: Interval) -> int:
        acts = [(s, e, k if k in self.launches else None) for s, e, k in self.activities]
        time = {t: _disjoint(v) for t, v in self.blocked.items()}
        return _helper_idle(window, acts, self.launches, time)  # type: ignore[arg-type]


def _nsys_raw(path: Path) -> Raw:
    raw = Raw()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "trace.sqlite"
        db.write_bytes(gzip.decompress(path.read_bytes()))
        conn = sqlite3.connect(db)
        try:
            strings = dict(conn.execute("SELECT id, value FROM StringIds"))
            for s, e, tid, corr, name_id in conn.execute(
                "SELECT start, end, globalTid, correlationId, nameId "
                "FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            ):
                api = _api(strings[name_id])
                if SYNC_API.match(api):
                    raw.syncs[api] += 1
                if _is_launch(api) and corr > 0:
                    raw.launch_calls += 1
                    raw.launches[(tid & ~0xFFFFFF, corr)] = (s, e, tid)
                if _blocks_host(api):
                    raw.blocked[tid].append((s, e))
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
            for table in ("KERNEL", "MEMCPY", "MEMSET"):
                if f"CUPTI_ACTIVITY_KIND_{table}" not in tables:
                    continue
                kind = ", copyKind" if table == "MEMCPY" else ", 0"
                for s, e, pid, corr, copy_kind in conn.execute(
                    f"SELECT start, end, globalPid, correlationId{kind} "
                    f"FROM CUPTI_ACTIVITY_KIND_{table}"
                ):
                    raw.activities.append((s, e, (pid, corr)))
                    launch = raw.launches.get((pid, corr))
                    if table == "MEMCPY" and copy_kind == 2 and launch is not None:  # D2H
                        raw.blocked[launch[2]].append((launch[0], max(launch[1], e)))
        finally:
            conn.close()
    return raw


def _ns(value: object) -> int:
    return int(Decimal(str(value)) * 1000)


def _kineto_raw(path: Path) -> Raw:
    raw = Raw()
    events = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    copies = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat, name, args = ev.get("cat"), ev.get("name", ""), ev.get("args") or {}
        start = _ns(ev["ts"])
        end = start + _ns(ev.get("dur", 0))
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            if SYNC_API.match(name):
                raw.syncs[name] += 1
            if _is_launch(name):
                raw.launch_calls += 1
                raw.launches[args["correlation"]] = (start, end, ev["tid"])
            if _blocks_host(name):
                raw.blocked[ev["tid"]].append((start, end))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            raw.activities.append((start, end, args.get("correlation")))
            if cat == "gpu_memcpy" and ("DtoH" in name or "Device -> Host" in name):
                copies.append((args.get("correlation"), end))
        elif cat == "cpu_op" and name in SYNC_OPS:
            raw.blocked[ev["tid"]].append((start, end))
    for corr, end in copies:
        if corr in raw.launches:
            s, e, tid = raw.launches[corr]
            raw.blocked[tid].append((s, max(e, end)))
    return raw


def _raw(path: Path) -> Raw:
    return _nsys_raw(path) if path.name.endswith(".sqlite.gz") else _kineto_raw(path)


@pytest.fixture(scope="module")
def analyses() -> dict[Path, Analysis]:
    return {path: run_analysis([path]) for path in [*NSYS, *KINETO]}


@pytest.mark.parametrize("path", [*NSYS, *KINETO], ids=lambda p: p.name)
def test_sync_calls_are_read_but_never_counted_as_launches(
    path: Path, analyses: dict[Path, Analysis]
) -> None:
    raw = _raw(path)
    trace = read_trace(path)
    sync = ~launch_calls(trace.launches)
    assert Counter(trace.strings[int(a)] for a in trace.launches["api"][sync]) == raw.syncs
    assert int((~sync).sum()) == raw.launch_calls
    report = analyses[path].report
    assert [s.launches for s in report.sources] == [raw.launch_calls]
    whole = [r.launches for r in report.rank_summaries if r.window == "whole trace"]
    assert sum(whole) == raw.launch_calls  # the whole trace: every launch call, no sync


@pytest.mark.parametrize("path", [*NSYS, *KINETO], ids=lambda p: p.name)
def test_sync_idle_equals_the_raw_rows(path: Path, analyses: dict[Path, Analysis]) -> None:
    raw = _raw(path)
    for step in analyses[path].report.step_accounts:
        got = sum(p.time_ns for p in step.parts if p.part == K.IDLE_SYNC)
        assert got == raw.sync_idle((step.start_ns, step.end_ns)), (step.window, step.index)


def test_a_sync_call_that_blocked_on_an_idle_gpu_is_synchronisation(
    analyses: dict[Path, Analysis],
) -> None:
    """The plain CUDA program under nsys waits in cudaDeviceSynchronize/cudaStreamSynchronize
    while its GPU idles: before the readers kept those calls, that idle was host-bound."""
    labels: Counter[str] = Counter()
    for path, analysis in analyses.items():
        for step in analysis.report.step_accounts:
            for part in step.parts:
                if part.part == K.IDLE_SYNC and SYNC_API.match(part.label):
                    labels[f"{path.name}: {part.label}"] += part.time_ns
    assert labels["nsys_plain_cuda.sqlite.gz: cudaDeviceSynchronize"] > 0, labels
