"""One run page view, in process: the HTML page and its ``.json`` twin of a real stored report.

The 3-arm Kineto traces are analysed once, the report is stored the way the worker stores it
(``record_report`` in a real SQLite file; a tree with page summaries builds the run's summary at
its first view), then each page is fetched ``--repeat`` times through the app (Starlette's
``TestClient``: no network). The first view of each page is left out. Run it against another
tree with ``PYTHONPATH=<that tree>`` to compare. A benchmark prints numbers; it asserts nothing.

Usage::

    python benchmarks/page_view_bench.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "tests" / "data" / "te-2.20.2-h200x2"
KINETO = [DATA / f"kineto_3arms_rank{r}.json.gz" for r in (0, 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    from analyzers import analyze
    from cptrace.app import create_app
    from service.core.config import Settings
    from service.storage import runs

    report = analyze(KINETO)
    text = report.model_dump_json()
    data_dir = Path(tempfile.mkdtemp(prefix="cptrace-pages-"))
    app = create_app(Settings(data_dir=data_dir, ingest_workers=0))

    def store(conn: sqlite3.Connection) -> int:
        run_id = runs.create_run(
            conn, name="reference", source="upload", status="analysed",
            manifest={"workload": {"implementation": "te"}},
        )  # fmt: skip
        runs.record_report(
            conn, run_id=run_id, schema_version=report.schema_version,
            catalog_version=report.catalog_version, report_json=text, duration_s=1.0,
            metrics=[],
        )  # fmt: skip
        return run_id

    run_id = app.state.db.write_tx(store)
    rows = []
    with TestClient(app) as client:
        for path in (f"/runs/{run_id}", f"/runs/{run_id}.json"):
            first = client.get(path)
            first.raise_for_status()
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                client.get(path).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
            rows.append(
                (path.replace(str(run_id), "{id}"), statistics.median(times), min(times),
                 len(first.content) / 1e6)
            )  # fmt: skip
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"run page views of the 3-arm Kineto report ({len(text) / 1e6:.1f} MB stored), "
        f"{args.repeat} views each; load average {load}"
    )
    print("| page | median ms | min ms | MB |")
    print("|---|---|---|---|")
    for path, median, best, size in rows:
        print(f"| `{path}` | {median:.0f} | {best:.0f} | {size:.2f} |")


if __name__ == "__main__":
    main()
