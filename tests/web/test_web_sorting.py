"""The run page's per-kernel table and GPU timeline in headless Chromium: the stacked bars are
drawn and a click on a column header sorts the rows by the exact figure."""

from __future__ import annotations

import pytest
from testkit import DATA_DIR
from web_browser import browser_page, charts, open_page, require_chromium
from web_fake_store import demo_store, make_app
from web_server import serve

from analyzers.pipeline import analyze

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # slow: scheduled first
DATA = DATA_DIR / "te-2.20.2-h200x2"


def _column(page, table: str, index: int) -> list[float]:
    cells = page.locator(f"#{table} tbody tr td:nth-child({index})")
    return [float(v) for v in cells.evaluate_all("cs => cs.map(c => c.dataset.value)")]


def test_kernel_table_sorts_and_timeline_bars_draw() -> None:
    require_chromium()
    report = analyze(
        [DATA / "kineto_3arms_rank0.json.gz", DATA / "kineto_3arms_rank1.json.gz"],
        step_pattern="^arm:",
    )
    store = demo_store()
    store.reports[1] = report
    with serve(make_app(store)) as url, browser_page() as page:
        open_page(page, f"{url}/runs/1")
        drawn = charts(page)
        assert "chart-gpu_timeline" in drawn, drawn.keys()
        total = _column(page, "kernels-table", 2)
        assert total == sorted(total, reverse=True)  # served by total time, largest first
        served = _column(page, "kernels-table", 3)
        page.locator("#kernels-table thead th", has_text="count").click()
        counts = _column(page, "kernels-table", 3)
        assert counts == sorted(served, reverse=True) and counts != served  # the rows moved
        page.locator("#kernels-table thead th", has_text="count").click()
        assert _column(page, "kernels-table", 3) == sorted(counts)
        assert page.errors == [], page.errors
