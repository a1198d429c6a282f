"""Run page views: bytes, server time (warm and cold) and Chromium's time to draw the page.

The 3-arm Kineto traces are analysed once and the report is stored ``--runs`` times the way
the worker stores it (``record_report`` with its page summary in a real SQLite file, then the
worker's after-store hook ``web.page_parts.store_built``, which builds the page; a tree before
that builds each page at its first view). Then, through the app (Starlette's ``TestClient``:
no network), each with the median CPU of this process per view (the app runs in it):

* warm: one run's page fetched ``--repeat`` times after a first view (what the server keeps
  built answers);
* cold: every view a run not viewed for ``--runs`` views (more runs than the server keeps
  built or parsed, so each view reads, parses and renders its page anew: what 100 readers
  clicking through many runs cost). Each run was viewed once before, untimed (a run's first
  view ever builds its page summary when the worker did not store one).

With ``--browser`` (needs Chromium) the app is served by uvicorn and headless Chromium loads
the HTML page ``--repeat`` times: milliseconds from navigation until every chart is drawn
(``body[data-charts-ready]``). Run it against another tree with ``PYTHONPATH=<that tree>`` to
compare. A benchmark prints numbers; it asserts nothing.

Usage::

    python benchmarks/page_view_bench.py [--repeat 7] [--runs N] [--browser]
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "tests" / "data" / "te-2.20.2-h200x2"
KINETO = [DATA / f"kineto_3arms_rank{r}.json.gz" for r in (0, 1)]


def store_runs(app: Any, count: int) -> tuple[list[int], int]:
    """``count`` runs holding the real 3-arm report, stored as the worker stores it (report,
    page summary, and the built page where the tree's worker builds it); their ids and the
    report's size."""
    from analyzers import analyze
    from service.page_summary import PAGE_SUMMARY_VERSION, page_summary
    from service.storage import runs

    report = analyze(KINETO)
    text = report.model_dump_json()
    summary = (PAGE_SUMMARY_VERSION, page_summary(report).model_dump_json())

    def store(conn: sqlite3.Connection) -> int:
        run_id = runs.create_run(
            conn, name="reference", source="upload", status="analysed",
            manifest={"workload": {"implementation": "te"}},
        )  # fmt: skip
        runs.record_report(
            conn, run_id=run_id, schema_version=report.schema_version,
            catalog_version=report.catalog_version, report_json=text, duration_s=1.0,
            metrics=[], page=summary,
        )  # fmt: skip
        return run_id

    ids = [app.state.db.write_tx(store) for _ in range(count)]
    # a tree before the built pages (PYTHONPATH at it) builds each page at its first view
    from web import data as web_data

    if (Path(web_data.__file__).parent / "page_parts.py").exists():
        from web.page_parts import store_built

        for run_id in ids:
            store_built(app.state.db, run_id)
    return ids, len(text)



def default_runs() -> int:
    """More runs than the server keeps built (``web.data``) or parsed (``service.store``), so
    that cycling through them misses both; a tree without those caches: 12."""
    from service import store
    from web import data

    kept = max(getattr(data, "BUILT_PAGES", 0), getattr(store, "PARSED_PAGES", 0))
    if hasattr(store, "PARSED_PAGE_BYTES"):  # bounded in bytes: the reference summary stores
        kept = store.PARSED_PAGE_BYTES // (store.PARSED_BYTES_PER_STORED_BYTE * 350_000)
    return kept + 4 if kept else 12


CPU_MS: list[float] = []
"""This process's CPU per timed view (the app runs in it, in ``TestClient``'s thread): what a
view costs on a shared machine, where wall time follows the load."""


def timed(get: Any, path: str) -> float:
    started, cpu = time.perf_counter(), time.process_time()
    get(path).raise_for_status()
    CPU_MS.append((time.process_time() - cpu) * 1000)
    return (time.perf_counter() - started) * 1000


def server_rows(
    app: Any, ids: list[int], repeat: int
) -> tuple[str, list[tuple[str, str, str, str]]]:
    """Each run's first HTML view (median / min ms, CPU), then (page, warm median / min ms,
    cold median / min ms, MB) of the HTML page and its twin."""
    from fastapi.testclient import TestClient

    rows = []
    with TestClient(app) as client:
        CPU_MS.clear()  # first views: a tree before the built pages builds each page here
        firsts = [timed(client.get, f"/runs/{run_id}") for run_id in ids]
        first_views = (
            f"{statistics.median(firsts):.0f} / {min(firsts):.0f} "
            f"(CPU {statistics.median(CPU_MS):.0f})"
        )
        for suffix in ("", ".json"):
            first = client.get(f"/runs/{ids[0]}{suffix}")
            first.raise_for_status()
            CPU_MS.clear()
            warm = [timed(client.get, f"/runs/{ids[0]}{suffix}") for _ in range(repeat)]
            warm_cpu = statistics.median(CPU_MS)
            CPU_MS.clear()
            cold = []
            for _ in range(max(1, repeat // len(ids) + 1)):
                cold += [timed(client.get, f"/runs/{i}{suffix}") for i in ids[1:] + ids[:1]]
            rows.append(
                (
                    f"`/runs/{{id}}{suffix}`",
                    f"{statistics.median(warm):.0f} / {min(warm):.0f} (CPU {warm_cpu:.0f})",
                    f"{statistics.median(cold):.0f} / {min(cold):.0f} "
                    f"(CPU {statistics.median(CPU_MS):.0f})",
                    f"{len(first.content) / 1e6:.2f}",
                )
            )
    return first_views, rows


def browser_row(app: Any, run_id: int, repeat: int) -> str:
    """Median / min ms from navigation to every chart drawn, in headless Chromium."""
    sys.path.insert(0, str(REPO / "tests" / "web"))
    sys.path.insert(0, str(REPO / "tests"))
    from web_server import serve

    from web.screenshots import CHROMIUM_ARGS, find_chromium

    executable = find_chromium()
    if executable is None:
        return "no Chromium (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    times = []
    with serve(app) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=list(CHROMIUM_ARGS))
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        for i in range(repeat + 1):
            page.goto("about:blank")
            started = time.perf_counter()
            page.goto(f"{url}/runs/{run_id}", wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_selector("body[data-charts-ready='true']", timeout=120_000)
            if i:  # the first load fills the browser's cache of plotly.js
                times.append((time.perf_counter() - started) * 1000)
        browser.close()
    return f"{statistics.median(times):.0f} / {min(times):.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--runs", type=int, default=None,
        help="runs stored (cold views cycle through them; default: 4 more than the server "
        "keeps built or parsed)",
    )  # fmt: skip
    parser.add_argument("--browser", action="store_true", help="also Chromium's time to draw")
    args = parser.parse_args()
    from cptrace.app import create_app
    from service.core.config import Settings

    data_dir = Path(tempfile.mkdtemp(prefix="cptrace-pages-"))
    app = create_app(Settings(data_dir=data_dir, ingest_workers=0))
    ids, stored = store_runs(app, max(2, args.runs or default_runs()))
    first_views, rows = server_rows(app, ids, args.repeat)
    drawn = browser_row(app, ids[0], args.repeat) if args.browser else None
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"run page views of the 3-arm Kineto report ({stored / 1e6:.1f} MB stored, {len(ids)} "
        f"runs), {args.repeat} warm views, cold views cycle through the runs; "
        f"{os.cpu_count()} CPU cores, load average {load}"
    )
    print(
        "| page | MB | server warm: median / min ms (CPU median) | server cold: median / min ms "
        "(CPU median) |"
    )
    print("|---|---|---|---|")
    for path, warm, cold, size in rows:
        print(f"| {path} | {size} | {warm} | {cold} |")
    print(f"\nEach run's first view of `/runs/{{id}}`: {first_views} ms (median / min, CPU median)")
    if drawn is not None:
        print(f"\nChromium, navigation to every chart drawn (`/runs/{{id}}`): {drawn} ms")


if __name__ == "__main__":
    main()
