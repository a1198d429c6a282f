"""nsys export throughput: read + attribute kernels per second, and peak RSS.

Each measurement runs in a fresh Python subprocess so peak RSS (``ru_maxrss``) belongs to that
one read and nothing else. The large export is built by ``make_large_nsys.py`` when missing.
The target (issue 2): >= 1 million kernels read and attributed per second on one core for an
export with >= 2 million kernels, with peak RSS below the export's size.

What is timed, per fresh process (imports and building the builtin catalog are excluded):

* ``read``: ``read_nsys(path)``: open + schema inspection, every table the reader uses
  (kernels, memcpy, memset, runtime launches, NVTX ranges with nesting, thread names), ranks.
* ``attribute``: ``attribute(trace, catalog)``: range matching and indexing, the activity ->
  launch join, the launch -> innermost range lookups, the precedence rules.
* ``e2e kernels/s`` = kernels / (read + attribute): the honest number. ``attr kernels/s`` is
  the attribution stage alone. Each stage is reported as wall time and as this process's CPU
  time (user + system); on a busy machine the CPU time is the stable one, on an idle core the
  two agree.

Usage::

    python benchmarks/nsys_throughput.py                       # 3-arm export + 2M-kernel export
    python benchmarks/nsys_throughput.py --export big.sqlite   # one given export
    python benchmarks/nsys_throughput.py --floor big.sqlite    # SQLite's own cost, no reader
    python benchmarks/nsys_throughput.py --cores 2 --readers 2 # 2 cores, 2 rowid-range readers
    CPTRACE_NSYS_BACKEND=sqlite3 python benchmarks/nsys_throughput.py   # without the fast extra
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMALL = REPO / "tests/data/te-2.20.2-h200x2/nsys_3arms.sqlite.gz"
LARGE = Path(tempfile.gettempdir()) / "cptrace_large_nsys.sqlite"
COLUMNS = (
    "export",
    "backend",
    "kernels",
    "size MB",
    "read s",
    "attribute s",
    "e2e kernels/s",
    "read cpu s",
    "attr cpu s",
    "e2e cpu kernels/s",
    "attr cpu kernels/s",
    "peak RSS MB",
)


def measure(path: Path) -> dict[str, object]:
    """Read (and attribute, when available) one export in this process."""
    from analyzers.model import ActivityKind
    from analyzers.readers import read_nsys

    baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started, cpu_started = time.perf_counter(), time.process_time()
    trace = read_nsys(path)
    read_s = time.perf_counter() - started
    read_cpu = time.process_time() - cpu_started
    from analyzers.attribution import attribute
    from analyzers.catalog import builtin_catalog

    catalog = builtin_catalog()
    started, cpu_started = time.perf_counter(), time.process_time()
    attribute(trace, catalog)
    attribute_s: float | None = time.perf_counter() - started
    attribute_cpu: float | None = time.process_time() - cpu_started
    kernels = int((trace.activities["kind"] == ActivityKind.KERNEL).sum())
    total_s = read_s + (attribute_s or 0.0)
    total_cpu = read_cpu + (attribute_cpu or 0.0)
    return {
        "export": path.name,
        "backend": trace.metadata.get("sqlite_backend", "?"),
        "kernels": kernels,
        "size MB": round(path.stat().st_size / 2**20, 1),
        "read s": round(read_s, 2),
        "attribute s": "n/a" if attribute_s is None else round(attribute_s, 2),
        "e2e kernels/s": round(kernels / total_s),
        "read cpu s": round(read_cpu, 2),
        "attr cpu s": "n/a" if attribute_cpu is None else round(attribute_cpu, 2),
        "e2e cpu kernels/s": round(kernels / total_cpu),
        "attr cpu kernels/s": "n/a" if not attribute_cpu else round(kernels / attribute_cpu),
        "peak RSS MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "baseline RSS MB": round(baseline_mb),
    }


def floor(path: Path, repeat: int = 3) -> list[tuple[str, float, int]]:
    """CPU seconds SQLite itself needs for the rows the reader takes: the floor under any reader.

    ``inside`` scans aggregate with ``total()``, so no value leaves SQLite; ``fetch`` scans move
    the same columns out through the Arrow (ADBC) driver into arrays and nothing more. Best of
    ``repeat`` runs each, CPU time of this process.
    """
    import sqlite3

    from analyzers.readers._arrow_sqlite import open_arrow
    from analyzers.readers._cuda_api import is_launch_api

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    rows = conn.execute("SELECT id, value FROM StringIds WHERE value LIKE 'cu%'").fetchall()
    ids = ",".join(str(i) for i, v in rows if is_launch_api(str(v)))
    kernel, runtime, nvtx = (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "NVTX_EVENTS",
    )
    launch_rows = f"FROM {runtime} WHERE nameId IN ({ids})"
    inside = {
        "inside: kernel, 7 columns": "SELECT total(start), total(end), total(correlationId), "
        "total(globalPid), total(deviceId + streamId), total(demangledName), "
        f"total(graphNodeId) FROM {kernel}",
        "inside: runtime, filter only": f"SELECT count(*) {launch_rows}",
        "inside: runtime, 4 columns of launches": "SELECT total(start), total(end), "
        f"total(globalTid), total(correlationId) {launch_rows}",
        "inside: nvtx, 3 columns of ranges": "SELECT total(start), total(end), total(globalTid) "
        f"FROM {nvtx} WHERE eventType IN (59, 60)",
    }
    fetch = {
        "fetch: kernel, packed (5 values/row)": "SELECT start, end, (correlationId << 32) | "
        "demangledName, globalPid | (deviceId << 16) | streamId, ifnull(graphNodeId, -1) "
        f"FROM {kernel}",
        "fetch: runtime, 4 columns of launches": "SELECT start, end, globalTid, correlationId "
        f"{launch_rows}",
        "fetch: nvtx, 3 columns of ranges": "SELECT start, ifnull(end, -1), globalTid "
        f"FROM {nvtx} WHERE eventType IN (59, 60)",
    }
    results: list[tuple[str, float, int]] = []
    for label, sql in inside.items():
        best = float("inf")
        for _ in range(repeat):
            started = time.process_time()
            conn.execute(sql).fetchone()
            best = min(best, time.process_time() - started)
        results.append((label, best, 0))
    arrow = open_arrow(path)
    if arrow is None:
        return results
    for label, sql in fetch.items():
        best, count = float("inf"), 0
        for _ in range(repeat):
            started = time.process_time()
            count = sum(len(batch[0][0]) for batch in arrow.batches(sql, 1 << 16))
            best = min(best, time.process_time() - started)
        results.append((label, best, count))
    arrow.close()
    conn.close()
    return results


def run_child(path: Path, cores: int = 1, readers: int | None = None) -> dict[str, object]:
    """Measure ``path`` in a fresh interpreter pinned to ``cores`` cores where the OS allows it,
    with ``readers`` connections per big table (``CPTRACE_NSYS_READERS``; None: as set)."""
    command = [sys.executable, __file__, "--child", str(path)]
    if hasattr(os, "sched_setaffinity"):
        pinned = ["taskset", "-c", ",".join(str(c) for c in range(cores))]
        command = [*pinned, *command] if _has_taskset() else command
    env = dict(os.environ)
    if readers is not None:
        env["CPTRACE_NSYS_READERS"] = str(readers)
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _has_taskset() -> bool:
    from shutil import which

    return which("taskset") is not None


def print_table(rows: list[dict[str, object]]) -> None:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS]
    line = " | ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True))
    sys.stdout.write(line + "\n" + "-+-".join("-" * w for w in widths) + "\n")
    for row in rows:
        cells = (str(row[c]).rjust(w) for c, w in zip(COLUMNS, widths, strict=True))
        sys.stdout.write(" | ".join(cells) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, action="append", help="export(s) to measure")
    parser.add_argument("--kernels", type=int, default=2_000_000, help="size of the built export")
    parser.add_argument("--repeat", type=int, default=1, help="fresh runs per export")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--floor", type=Path, help="time SQLite's own scans of this export")
    parser.add_argument(
        "--cores", type=int, default=1, help="pin each run to this many cores (parallel reads)"
    )
    parser.add_argument(
        "--readers", type=int, help="connections per big table (CPTRACE_NSYS_READERS)"
    )
    args = parser.parse_args(argv)
    if args.floor:
        for label, seconds, count in floor(args.floor):
            sys.stdout.write(
                f"{label:40s} {seconds:6.3f} s cpu{f'  {count} rows' if count else ''}\n"
            )
        return 0
    if args.child:
        sys.stdout.write(json.dumps(measure(args.child)) + "\n")
        return 0
    exports = args.export or [SMALL, LARGE]
    if LARGE in exports and not LARGE.exists():
        from benchmarks.make_large_nsys import build

        build(SMALL, LARGE, args.kernels)
    rows = [
        run_child(path, args.cores, args.readers) for path in exports for _ in range(args.repeat)
    ]
    print_table(rows)
    baseline = min(int(r["baseline RSS MB"]) for r in rows)  # type: ignore[call-overload]
    readers = args.readers or os.environ.get("CPTRACE_NSYS_READERS", "1")
    sys.stdout.write(
        f"(interpreter + numpy baseline RSS: {baseline} MB; {args.cores} core(s) via taskset;"
        f" {readers} reader(s); load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
