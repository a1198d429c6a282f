"""The run list's SQL over many stored runs: what the verdict and the loop's tags cost.

Inserts ``--runs`` runs (each with the manifest of a real demo bundle, tagged like a loop run;
every ``--failed-every``-th with a failure record) through ``service.storage.runs.create_run``
into each ``--database`` (SQLite, PostgreSQL), then times the list queries the pages and the
API run as the API runs them: through the database handle's ``read`` (on PostgreSQL: a pooled
connection, the read time limit, every round trip). Best and median of ``--reps``; a loaded
machine moves the median, hardly the best. Prints a table and the load average.

    python benchmarks/run_list_sql.py --runs 10000
    python benchmarks/run_list_sql.py --runs 10000 --database sqlite postgresql
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_database import analyze_postgres, choice_help, database_url

from service.core.config import Settings
from service.main import open_database
from service.storage import runs, schema
from service.storage.engine import AnyDatabase, Conn, execute
from service.storage.runs import RunFilters
from service.store import run_detail_json, run_page_json

DEMO = Path(__file__).resolve().parents[1] / "demo" / "bundles"
MANIFEST_OF = DEMO / "te-2.20.2-reference-3arms-h200x2.tar.gz"


def populate(conn: Conn, count: int, failed_every: int) -> int:
    with tarfile.open(MANIFEST_OF) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest: dict[str, Any] = json.loads(member.read())
    manifest["run"].update(repo="octo/model", pr=7, suite="smoke", spec_name="reference")
    stack = 'Current thread 0x1 (most recent call first):\n  File "train.py", line 30 in step\n'
    failed = {**manifest, "failure": {"summary": "hung", "stacks": {"0": stack, "1": stack}}}
    for i in range(1, count + 1):
        run_id = runs.create_run(
            conn, name=f"run{i}", source="upload", status="analysed", branch="main",
            commit="a" * 40, config_key="k",
            manifest=failed if i % failed_every == 0 else manifest,
        )  # fmt: skip
        metric = {"run_id": run_id, "metric": "findings", "label": "", "value": i % 3}
        execute(conn, schema.run_metrics.insert().values(**metric))
    return len(json.dumps(manifest))


def times_ms(fn: Callable[[], object], reps: int) -> tuple[float, float, float]:
    """(best wall, median wall, CPU of this process per call) in milliseconds over ``reps``
    calls: the CPU one API process spends on a read, which a loaded machine hardly moves."""
    times = []
    cpu = time.process_time()
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    cpu_ms = (time.process_time() - cpu) / reps * 1e3
    return min(times), statistics.median(times), cpu_ms


def queries(db: AnyDatabase) -> list[tuple[str, Callable[[], object]]]:
    def read(fn: Callable[[Conn], object]) -> Callable[[], object]:
        return lambda: db.read(fn)

    return [
        ("list 50, newest first", read(lambda c: runs.list_runs(
            c, filters=RunFilters(), limit=50, offset=0))),
        ("list 50, verdict=failed", read(lambda c: runs.list_runs(
            c, filters=RunFilters(verdict="failed"), limit=50, offset=0))),
        ("count, verdict=failed", read(lambda c: runs.count_runs(
            c, filters=RunFilters(verdict="failed")))),
        ("list 50, sorted by verdict", read(lambda c: runs.list_runs(
            c, filters=RunFilters(), limit=50, offset=0, sort="verdict"))),
        ("list 50, pr=7 suite=smoke", read(lambda c: runs.list_runs(
            c, filters=RunFilters(pr=7, suite="smoke"), limit=50, offset=0))),
        ("count of all runs", read(runs.total_runs)),
        ("API run list page (`GET /runs?limit=50`)", lambda: run_page_json(db, limit=50)),
        ("API run detail (`GET /runs/{id}`)", lambda: run_detail_json(db, 77)),
    ]  # fmt: skip


def measure(choice: str, args: argparse.Namespace, tmp: Path) -> tuple[int, dict[str, Any]]:
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(database_url(choice))
        db = open_database(Settings(data_dir=tmp / choice.replace("/", "_"), database_url=url))
        stack.callback(db.close)
        size = db.write_tx(lambda c: populate(c, args.runs, args.failed_every))
        if url:
            analyze_postgres(url)
        return size, {label: times_ms(fn, args.reps) for label, fn in queries(db)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--failed-every", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--database", nargs="+", default=["sqlite"], help=choice_help())
    args = parser.parse_args()
    found: dict[str, dict[str, tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for choice in args.database:
            size, found[choice] = measure(choice, args, Path(tmp))
    names = ["PostgreSQL" if c != "sqlite" else "SQLite" for c in args.database]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.runs} runs, manifests of {size:,} bytes, 1 in {args.failed_every} failed; "
          f"wall best / median of {args.reps} reads, and this process's CPU per read; "
          f"load average {load}")  # fmt: skip
    print("| query | " + " | ".join(f"{n} ms: best / median / CPU" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for label in next(iter(found.values())):
        cells = ["{:.2f} / {:.2f} / {:.2f}".format(*found[c][label]) for c in args.database]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
