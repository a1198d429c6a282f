"""Build a large nsys export by replicating the rows of the real 3-arm export.

Why: the reader's throughput target is stated for exports with >= 2 million kernels, and no
real capture of that size can live in the repository. Each copy shifts timestamps by the
source span (so copies follow each other in time, like a longer run) and correlation ids by the
source maximum (so every kernel still joins exactly one launch). Every event table is
replicated, including ones the reader ignores, so the file size is realistic.

With ``--ranks R`` the export is a run of R ranks (R a multiple of the source's 2): the rows
are copied again R/2 - 1 times at the same instants as new processes (``pid`` + 65536 per copy,
in ``globalPid``/``globalTid`` too) on new devices (``deviceId`` + 2 per copy), one device each,
so the reader numbers the ranks by device: rank r is the process on device r, the r // 2-th
copy's (r % 2)-th process. ``--kernels`` is then the export's total (R/2 copies of the pair).

Usage::

    python benchmarks/make_large_nsys.py --kernels 2000000 --out cptrace_large_nsys.sqlite
    python benchmarks/make_large_nsys.py --kernels 1600000 --ranks 32 --out ranks32.sqlite
"""

from __future__ import annotations

import argparse
import gzip
import math
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "tests/data/te-2.20.2-h200x2/nsys_3arms.sqlite.gz"
EVENT_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_CUDA_EVENT",
    "NVTX_EVENTS",
)
SHIFTED_TIME = ("start", "end", "timestamp")
SHIFTED_ID = ("correlationId",)
RANK_TABLES = (*EVENT_TABLES, "ThreadNames", "PROCESSES", "TARGET_INFO_GPU")
"""What a rank copy copies: the events, and the names of its threads, process and GPU."""
SHIFTED_PROCESS = ("globalPid", "globalTid", "endGlobalTid")
"""nsys ids holding the process id in bits 24-47 (``hostId << 48 | pid << 24 | tid``)."""
SHIFTED_DEVICE = ("deviceId", "srcDeviceId", "dstDeviceId", "cuDevice")
PID_STEP = 1 << 16
"""Process ids of a rank copy: the source's plus this many per copy (below 2**24)."""


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _copy_select(conn: sqlite3.Connection, table: str) -> str:
    """INSERT ... SELECT that copies the original rows with shifted times and ids."""
    cols = _columns(conn, table)
    exprs = []
    for col in cols:
        if col in SHIFTED_TIME:
            exprs.append(f'"{col}" + :dt')
        elif col in SHIFTED_ID:
            exprs.append(f'"{col}" + :dc')
        else:
            exprs.append(f'"{col}"')
    # Domain-create rows (eventType 75) are per process, not per event: copy them once only.
    where = "rowid <= :n" + (" AND eventType != 75" if table == "NVTX_EVENTS" else "")
    names = ", ".join(f'"{c}"' for c in cols)
    return f'INSERT INTO "{table}" ({names}) SELECT {", ".join(exprs)} FROM "{table}" WHERE {where}'


def _rank_select(conn: sqlite3.Connection, table: str) -> str:
    """INSERT ... SELECT that copies the rows as other processes on other devices."""
    cols = _columns(conn, table)
    exprs = []
    for col in cols:
        if col in SHIFTED_PROCESS:
            exprs.append(f'"{col}" + :dp * {PID_STEP << 24}')
        elif col == "pid":
            exprs.append(f'"{col}" + :dp * {PID_STEP}')
        elif col in SHIFTED_DEVICE:
            exprs.append(f'"{col}" + :dd')
        elif col in SHIFTED_ID:
            exprs.append(f'"{col}" + :dc')
        else:
            exprs.append(f'"{col}"')
    names = ", ".join(f'"{c}"' for c in cols)
    select = f'SELECT {", ".join(exprs)} FROM "{table}" WHERE rowid <= :n'
    return f'INSERT INTO "{table}" ({names}) {select}'


def _add_ranks(conn: sqlite3.Connection, ranks: int) -> None:
    """Copy the export R/2 - 1 times as the ranks after the source's (see the docstring)."""
    devices = conn.execute("SELECT count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    per_copy = int(devices.fetchone()[0])
    if ranks % per_copy:
        raise SystemExit(f"--ranks {ranks}: not a multiple of the source's {per_copy} ranks")
    tables = [t for t in RANK_TABLES if _columns(conn, t)]
    max_corr = max(
        conn.execute(f"SELECT max(correlationId) FROM {t}").fetchone()[0] or 0
        for t in tables
        if "correlationId" in _columns(conn, t)
    )
    originals = {t: conn.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0] for t in tables}
    statements = {t: _rank_select(conn, t) for t in tables}
    for k in range(1, ranks // per_copy):
        params = {"dp": k, "dd": k * per_copy, "dc": k * (max_corr + 1)}
        for table in tables:
            if originals[table] is not None:
                conn.execute(statements[table], {**params, "n": originals[table]})
        conn.commit()


def build(source: Path, out: Path, kernels: int, ranks: int | None = None) -> int:
    """Write the replicated export to ``out``; returns the kernel count."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "src.sqlite"
        opener = gzip.open if source.suffix == ".gz" else open
        with opener(source, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        out.unlink(missing_ok=True)
        shutil.copyfile(plain, out)
    conn = sqlite3.connect(out)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    tables = [t for t in EVENT_TABLES if _columns(conn, t)]
    base = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    lo, hi = conn.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    max_corr = max(
        conn.execute(f"SELECT max(correlationId) FROM {t}").fetchone()[0] or 0
        for t in tables
        if "correlationId" in _columns(conn, t)
    )
    originals = {t: conn.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0] for t in tables}
    statements = {t: _copy_select(conn, t) for t in tables}
    pairs = ranks // 2 if ranks else 1  # the source's two ranks copied this many times
    copies = math.ceil(kernels / pairs / base)
    for k in range(1, copies):
        params = {"dt": k * (hi - lo + 1_000_000), "dc": k * (max_corr + 1)}
        for table in tables:
            conn.execute(statements[table], {**params, "n": originals[table]})
        conn.commit()
    if ranks:
        _add_ranks(conn, ranks)
    total = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    conn.close()
    return int(total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    default_out = Path(tempfile.gettempdir()) / "cptrace_large_nsys.sqlite"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--kernels", type=int, default=2_000_000)
    parser.add_argument("--ranks", type=int, help="ranks of the export (even; default 2)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    total = build(args.source, args.out, args.kernels, args.ranks)
    size_mb = args.out.stat().st_size / 2**20
    elapsed = time.perf_counter() - started
    sys.stdout.write(f"{args.out}: {total} kernels, {size_mb:.0f} MB, built in {elapsed:.1f} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
