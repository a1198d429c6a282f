"""Headless Chromium against a real uvicorn server: pages, charts, filters, links, escaping.

Data comes from an in-memory store with known numbers (web_fake_store), so the assertions can be
exact; test_web_live.py runs the same kind of checks against the real service with demo data.
"""

from __future__ import annotations

import pytest
from web_browser import browser_page, charts, open_page
from web_fake_store import demo_store, make_app
from web_server import serve

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    with serve(make_app(demo_store())) as url:
        yield url


@pytest.fixture(scope="module")
def page():
    with browser_page() as page:
        yield page


def test_run_page_draws_every_chart_with_its_traces(server, page) -> None:
    open_page(page, f"{server}/runs/1")
    drawn = charts(page)
    assert set(drawn) == {
        "chart-iterations",
        "chart-helper_launches",
        "chart-helper_time",
        "chart-category_time",
        "chart-timeline",
    }
    assert drawn["chart-iterations"]["traces"] == ["rank 0", "rank 1"]
    assert drawn["chart-iterations"]["points"] == [40, 40]
    assert set(drawn["chart-timeline"]["traces"]) == {"attn_fwd_step", "zero_fill&lt;dQ&gt;"}
    assert all(c["svgTraces"] > 0 for c in drawn.values())
    # the template name shows literally in the legend and in the page, and created no element
    legend = page.locator("#chart-timeline .legend").text_content()  # SVG: no innerText
    assert "zero_fill<dQ>" in legend
    assert page.evaluate("document.getElementsByTagName('dQ').length") == 0
    assert "DotProductAttention <fast path>" in page.inner_text("#findings")


def test_runs_filters_sorting_and_links(server, page) -> None:
    open_page(page, f"{server}/runs")
    assert page.locator("#runs-table tbody tr").count() == 9
    with page.expect_navigation():
        page.select_option("select[name=implementation]", "te")  # submits on change
    assert "implementation=te" in page.url
    ids = page.locator("#runs-table tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.runId))"
    )
    assert ids == [7, 5, 3, 1]
    with page.expect_navigation():
        page.click("#runs-table th a:has-text('median ms')")
    ids = page.locator("#runs-table tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.runId))"
    )
    assert ids == [1, 3, 5, 7]  # descending median: run 1 is the slowest
    assert "implementation=te" in page.url  # sorting kept the filter
    with page.expect_navigation():
        page.click("#runs-table a:text-is('run-3')")
    assert page.url.endswith("/runs/3")
    page.wait_for_selector("body[data-charts-ready='true']")
    with page.expect_navigation():
        page.click("a.arm-compare")
    assert "/compare/3/3?base_window=arm%3Aauto_clone" in page.url


def test_compare_form_and_comparison_page_deltas(server, page) -> None:
    open_page(page, f"{server}/runs")
    page.fill("#compare-base", "2")
    page.fill("#compare-head", "4")
    with page.expect_navigation():
        page.click("form.compare-form button")
    assert page.url == f"{server}/compare/2/4"
    page.wait_for_selector("body[data-charts-ready='true']")
    assert page.errors == []
    rows = page.locator("#deltas-table tbody tr")
    launches = rows.filter(has_text="launches per step").inner_text().split("\t")
    assert launches[1:5] == ["72.0", "16.0", "-56.0", "-77.8%"]
    median = rows.filter(has_text="iteration time, median").inner_text()
    assert "significant" in median and "-12.8%" in median
    helpers = page.locator("#helper-deltas-table tbody tr").all_inner_texts()
    assert helpers[0].startswith("zero_fill<dQ>\tzero-fill\t24.0\t0.0\t-24.0\t-0.216")
    drawn = charts(page)
    assert drawn["chart-distributions"]["traces"] == ["base: auto_clone", "head: explicit_false"]
    assert drawn["chart-helper_deltas"]["points"] == [2, 2]
    assert page.inner_text("h1 .badge") == "faster"


def test_history_and_catalog_pages(server, page) -> None:
    open_page(page, f"{server}/history")
    with page.expect_navigation():
        page.select_option("select[name=config_key]", "ref-2xh200")
    page.wait_for_selector("body[data-charts-ready='true']")
    assert page.errors == []
    drawn = charts(page)["chart-history"]
    assert drawn["traces"] == ["noise band", "iteration_median_ms"]
    assert drawn["points"][1] == 7
    assert page.locator("#history-table tr.outside").count() == 2  # the drop and the next run
    open_page(page, f"{server}/catalog")
    assert page.locator("#catalog-table tbody tr").count() > 10
    assert charts(page) == {}


def test_error_pages_render_without_console_errors(server, page) -> None:
    response = page.goto(f"{server}/runs/99")
    assert response is not None and response.status == 404
    assert "run 99 does not exist" in page.inner_text("main")
