"""The reference figures equal what the trace itself says, computed here without our code.

For every real trace (``tests/data``, ``tests/data/openworld`` and, when given, the folder
``--shared-traces`` / ``$CPTRACE_SHARED_TRACES`` names), the
expected numbers come from plain ``sqlite3`` queries on the nsys export and plain walks over
the Kineto JSON (times as exact decimals), and must equal the report's figures: exactly for
counts and integer ns, to floating-point rounding for averages, medians and deviations.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from testkit import DATA_DIR, shared_traces_dir

from analyzers.pipeline import run_analysis
from analyzers.report import AnalysisReport
from analyzers.windows import WHOLE_TRACE
from tests.analyzers.real_traces import whole_trace_report

SEARCHED = [d for d in (DATA_DIR, shared_traces_dir()) if d is not None]


def _real_traces() -> list[Path]:
    """Every nsys export and Kineto file once (the shared copies equal some of ours)."""
    seen: dict[str, Path] = {}
    for base in SEARCHED:
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            name = path.name
            if not (name.endswith((".sqlite", ".sqlite.gz", ".json", ".json.gz"))):
                continue
            if name.startswith(("manifest", "report")):
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            seen.setdefault(digest, path)
    return list(seen.values())


TRACES = _real_traces()


def _is_nsys(path: Path) -> bool:
    return ".sqlite" in path.name


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: f"{p.parent.name}/{p.name}")
def analysed(request: pytest.FixtureRequest) -> tuple[Path, AnalysisReport]:
    path: Path = request.param
    if _is_nsys(path):
        return path, run_analysis([path]).report
    return path, whole_trace_report(path)


# ---- the expected figures, from the trace itself ------------------------------------------


class Expected:
    """Per device: counts, summed durations, bytes, kernel span, launch matches; per kernel name
    (all ranks): the list of durations."""

    def __init__(self) -> None:
        self.count: dict[tuple[str, int], int] = defaultdict(int)
        self.time: dict[tuple[str, int], int] = defaultdict(int)
        self.bytes: dict[tuple[str, int], int] = defaultdict(int)
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.with_launch: dict[int, int] = defaultdict(int)
        self.durations: dict[str, list[int]] = defaultdict(list)

    def add(self, kind: str, device: int, start: int, end: int, size: int | None) -> None:
        self.count[kind, device] += 1
        self.time[kind, device] += end - start
        if size is not None and size >= 0:
            self.bytes[kind, device] += size
        if kind == "kernel":
            self.first[device] = min(self.first.get(device, start), start)
            self.last[device] = max(self.last.get(device, end), end)


def _sqlite(path: Path, tmp: Path) -> sqlite3.Connection:
    if path.name.endswith(".gz"):
        target = tmp / path.name.removesuffix(".gz")
        with gzip.open(path) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        path = target
    return sqlite3.connect(path)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _expected_nsys(path: Path, tmp: Path) -> Expected:
    conn = _sqlite(path, tmp)
    tables = _tables(conn)
    exp = Expected()
    kernel, copy, fill = (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
    )
    launch_tables = [
        t for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER") if t in tables
    ]
    launched: set[tuple[int, int]] = set()
    for t in launch_tables:
        launched |= {
            (int(tid) >> 24, int(c))
            for tid, c in conn.execute(f"SELECT globalTid, correlationId FROM {t}")
        }
    if kernel in tables:
        name_col = next(
            c for c in ("demangledName", "shortName", "mangledName") if c in _columns(conn, kernel)
        )
        names = dict(conn.execute("SELECT id, value FROM StringIds").fetchall())
        for device, start, end, pid, corr, name in conn.execute(
            f'SELECT deviceId, start, "end", globalPid, correlationId, {name_col} FROM {kernel}'
        ):
            exp.add("kernel", device, start, end, None)
            exp.durations[names[name]].append(end - start)
            if (int(pid) >> 24, int(corr)) in launched:
                exp.with_launch[device] += 1
    for kind, table in (("memcpy", copy), ("memset", fill)):
        if table in tables:
            size = "bytes" if "bytes" in _columns(conn, table) else "NULL"
            for device, start, end, nbytes in conn.execute(
                f'SELECT deviceId, start, "end", {size} FROM {table}'
            ):
                exp.add(kind, device, start, end, nbytes)
    conn.close()
    return exp


def _ns(value: Decimal | int) -> int:
    """Kineto microseconds -> ns, exactly (JSON read with Decimal floats)."""
    scaled = Decimal(value) * 1000
    assert scaled == scaled.to_integral_value(), f"{value} µs is not whole ns"
    return int(scaled)


def _events(path: Path) -> Iterator[dict[str, object]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        doc = json.load(f, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    yield from (e for e in events if isinstance(e, dict) and e.get("ph") == "X")


def _expected_kineto(path: Path) -> Expected:
    exp = Expected()
    events = list(_events(path))
    launched = {
        e["args"]["correlation"]  # type: ignore[index]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and isinstance(e.get("args"), dict)
        and "correlation" in e["args"]  # type: ignore[operator]
    }
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    for e in events:
        kind = kinds.get(str(e.get("cat")))
        if kind is None:
            continue
        args = e.get("args") or {}
        assert isinstance(args, dict)
        device = int(args.get("device", e.get("pid")))  # type: ignore[arg-type]
        start = _ns(e["ts"])  # type: ignore[arg-type]
        end = start + _ns(e.get("dur", 0))  # type: ignore[arg-type]
        exp.add(kind, device, start, end, args.get("bytes") if kind != "kernel" else None)
        if kind == "kernel":
            exp.durations[str(e.get("name", ""))].append(end - start)
            if args.get("correlation") in launched:
                exp.with_launch[device] += 1
    return exp


@pytest.fixture(scope="module")
def expected(
    analysed: tuple[Path, AnalysisReport], tmp_path_factory: pytest.TempPathFactory
) -> Expected:
    path, _ = analysed
    if _is_nsys(path):
        return _expected_nsys(path, tmp_path_factory.mktemp("nsys"))
    return _expected_kineto(path)


# ---- the checks ---------------------------------------------------------------------------


def _per_device(report: AnalysisReport, field: str) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for d in report.devices:
        out[d.device] += getattr(d, field)
    return {k: v for k, v in out.items() if v}


def _nonzero(values: dict[tuple[str, int], int], kind: str) -> dict[int, int]:
    return {dev: v for (k, dev), v in values.items() if k == kind and v}


def test_device_counts_times_and_bytes(
    analysed: tuple[Path, AnalysisReport], expected: Expected
) -> None:
    _, report = analysed
    for kind, count, time, size in (
        ("kernel", "kernels", "kernel_time_ns", None),
        ("memcpy", "memcpy", "memcpy_time_ns", "memcpy_bytes"),
        ("memset", "memset", "memset_time_ns", "memset_bytes"),
    ):
        assert _per_device(report, count) == _nonzero(expected.count, kind), kind
        assert _per_device(report, time) == _nonzero(expected.time, kind), kind
        if size:
            assert _per_device(report, size) == _nonzero(expected.bytes, kind), kind
    total = defaultdict(int)
    for (_, dev), v in expected.time.items():
        total[dev] += v
    assert _per_device(report, "gpu_time_ns") == {k: v for k, v in total.items() if v}


def test_kernel_span_and_launch_matching(
    analysed: tuple[Path, AnalysisReport], expected: Expected
) -> None:
    _, report = analysed
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for d in report.devices:
        if d.kernel_first_ns is not None and d.kernel_last_ns is not None:
            first[d.device] = min(first.get(d.device, d.kernel_first_ns), d.kernel_first_ns)
            last[d.device] = max(last.get(d.device, d.kernel_last_ns), d.kernel_last_ns)
    assert first == expected.first and last == expected.last
    one_rank_per_device = len({(d.rank, d.device) for d in report.devices}) == len(
        {d.device for d in report.devices}
    )
    if one_rank_per_device:
        assert {d.device: d.kernel_span_ns for d in report.devices if d.kernels} == {
            dev: expected.last[dev] - expected.first[dev] for dev in expected.first
        }
    assert _per_device(report, "kernels_with_launch") == {
        k: v for k, v in expected.with_launch.items() if v
    }
    for d in report.devices:
        assert d.kernels_with_launch + d.kernels_without_launch == d.kernels


def test_kernel_table_matches_cuda_gpu_kern_sum(
    analysed: tuple[Path, AnalysisReport], expected: Expected
) -> None:
    _, report = analysed
    rows = {k.name: k for k in report.kernels if k.window == WHOLE_TRACE and k.rank is None}
    assert set(rows) == set(expected.durations)
    grand = sum(sum(d) for d in expected.durations.values())
    for name, durations in expected.durations.items():
        row = rows[name]
        assert (row.count, row.total_ns, row.min_ns, row.max_ns) == (
            len(durations),
            sum(durations),
            min(durations),
            max(durations),
        ), name
        assert row.average_ns == pytest.approx(statistics.fmean(durations), rel=1e-12)
        assert row.median_ns == pytest.approx(statistics.median(durations), rel=1e-12)
        sd = statistics.stdev(durations) if len(durations) > 1 else 0.0
        assert row.stddev_ns == pytest.approx(sd, rel=1e-9, abs=1e-9)
        assert row.time_pct == pytest.approx(100.0 * sum(durations) / grand, rel=1e-12)


def test_per_rank_kernel_rows_add_up_to_the_all_ranks_rows(
    analysed: tuple[Path, AnalysisReport],
) -> None:
    _, report = analysed
    for group in report.groups:
        summed: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for k in report.kernels:
            if k.window == group and k.rank is not None:
                summed[k.name][0] += k.count
                summed[k.name][1] += k.total_ns
        pooled = {
            k.name: [k.count, k.total_ns]
            for k in report.kernels
            if k.window == group and k.rank is None
        }
        assert pooled == dict(summed), group


def test_timeline_parts_add_up_and_busy_fits_the_window(
    analysed: tuple[Path, AnalysisReport],
) -> None:
    _, report = analysed
    assert report.window_timelines
    for t in [*report.window_timelines, *report.gpu_timeline]:
        assert t.busy_ns <= t.total_ns
        assert t.computation_ns + t.exposed_communication_ns + t.exposed_memcpy_ns == t.busy_ns
        assert t.busy_ns + t.idle_ns == t.total_ns
        assert min(t.computation_ns, t.exposed_communication_ns, t.exposed_memcpy_ns) >= 0
    for s in report.rank_summaries:
        group = next(g for g in report.gpu_timeline if g.window == s.window and g.rank == s.rank)
        assert s.gpu_busy_ns == group.busy_ns <= group.total_ns
