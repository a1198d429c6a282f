"""The run list's SQL over many stored runs: what the verdict and the loop's tags cost.

Inserts ``--runs`` runs (each with the manifest of a real demo bundle, tagged like a loop run;
every ``--failed-every``-th with a failure record) through ``service.storage.runs.create_run``
into a migrated SQLite file, then times the list queries the pages and the API run (best of
``--reps``, so a loaded machine's noise is left out). Prints a table.

    python benchmarks/run_list_sql.py --runs 10000
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.storage import runs
from service.storage.migrations import apply_migrations
from service.storage.runs import RunFilters

DEMO = Path(__file__).resolve().parents[1] / "demo" / "bundles"
MANIFEST_OF = DEMO / "te-2.20.2-reference-3arms-h200x2.tar.gz"


def populate(conn: sqlite3.Connection, count: int, failed_every: int) -> int:
    with tarfile.open(MANIFEST_OF) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest: dict[str, Any] = json.loads(member.read())
    manifest["run"].update(repo="octo/model", pr=7, suite="smoke", spec_name="reference")
    stack = 'Current thread 0x1 (most recent call first):\n  File "train.py", line 30 in step\n'
    failed = {**manifest, "failure": {"summary": "hung", "stacks": {"0": stack, "1": stack}}}
    with conn:
        for i in range(1, count + 1):
            run_id = runs.create_run(
                conn, name=f"run{i}", source="upload", status="analysed", branch="main",
                commit="a" * 40, config_key="k",
                manifest=failed if i % failed_every == 0 else manifest,
            )  # fmt: skip
            conn.execute(
                "INSERT INTO run_metrics (run_id, metric, label, value)"
                " VALUES (?, 'findings', '', ?)",
                (run_id, i % 3),
            )
    return len(json.dumps(manifest))


def best_ms(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--failed-every", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "runs.db")
        conn.row_factory = sqlite3.Row
        apply_migrations(conn)
        size = populate(conn, args.runs, args.failed_every)
        queries: list[tuple[str, Callable[[], object]]] = [
            ("list 50, newest first", lambda: runs.list_runs(
                conn, filters=RunFilters(), limit=50, offset=0)),
            ("list 50, verdict=failed", lambda: runs.list_runs(
                conn, filters=RunFilters(verdict="failed"), limit=50, offset=0)),
            ("count, verdict=failed", lambda: runs.count_runs(
                conn, filters=RunFilters(verdict="failed"))),
            ("list 50, sorted by verdict", lambda: runs.list_runs(
                conn, filters=RunFilters(), limit=50, offset=0, sort="verdict")),
            ("list 50, pr=7 suite=smoke", lambda: runs.list_runs(
                conn, filters=RunFilters(pr=7, suite="smoke"), limit=50, offset=0)),
        ]  # fmt: skip
        print(f"{args.runs} runs, manifests of {size:,} bytes, 1 in {args.failed_every} failed; "
              f"best of {args.reps}")  # fmt: skip
        print("| query | ms |\n|---|---:|")
        for label, fn in queries:
            print(f"| {label} | {best_ms(fn, args.reps):.2f} |")
        conn.close()


if __name__ == "__main__":
    main()
