"""The dashboards of the real service: demo bundles ingested and analysed by the real worker,
served by uvicorn on loopback, driven by headless Chromium, plus the screenshot script."""

from __future__ import annotations

import subprocess
import sys

import pytest
from stored_runs import drain_worker
from testkit import REPO_ROOT
from typer.testing import CliRunner
from web_browser import browser_page, charts, open_page, require_chromium
from web_server import serve

from cptrace.cli import app as cli_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # slow: scheduled first
ARMS = "base_window=arm%3Aauto_clone&head_window=arm%3Aexplicit_false"
DEMO_BUNDLES = sorted(
    p.name.removesuffix(".tar.gz") for p in (REPO_ROOT / "demo" / "bundles").glob("*.tar.gz")
)
"""The bundles ``seed_demo`` ingests (one run each): the run pages are tested one by one."""


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(server url, {bundle stem: run id}) of a service seeded with demo/bundles/*.tar.gz."""
    require_chromium()
    from cptrace.app import create_app
    from service.bootstrap import default_demo_dir, seed_demo
    from service.core.config import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("live"))
    app = create_app(settings)
    seeded = seed_demo(app.state.db, settings, default_demo_dir())
    assert seeded and all(r.error is None for r in seeded), seeded
    drain_worker(settings)
    from service.store import list_runs

    failed = [(r.name, r.error) for r in list_runs(app.state.db) if r.status != "analysed"]
    assert not failed, f"demo runs the worker could not analyse: {failed}"
    runs = {r.path.name.removesuffix(".tar.gz"): r.run_id for r in seeded}
    with serve(app) as url:
        yield url, runs
    app.state.db.close()


def _arms_run(url: str) -> int:
    """The demo run holding the reference workload's arms (Kineto: windows named arm:...)."""
    import httpx

    for run in httpx.get(f"{url}/runs.json?sort=id&order=asc").json()["runs"]:
        groups = httpx.get(f"{url}/runs/{run['id']}.json").json()["run"]["window_groups"]
        if {"arm:auto_clone", "arm:explicit_false"} <= set(groups):
            return int(run["id"])
    raise AssertionError("no demo run with the arms auto_clone and explicit_false")


@pytest.fixture(scope="module")
def page():
    with browser_page() as page:
        yield page


def test_every_demo_run_is_analysed_and_listed(live, page) -> None:
    url, runs = live
    open_page(page, f"{url}/runs")
    listed = page.locator("#runs-table tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.runId))"
    )
    assert sorted(listed) == sorted(runs.values())
    verdicts = page.locator("#runs-table .badge").all_inner_texts()
    assert set(verdicts) <= {"clean", "findings"}, verdicts  # none failed or pending


def test_the_demo_bundles_are_the_seeded_runs(live) -> None:
    _, runs = live
    assert DEMO_BUNDLES and sorted(runs) == DEMO_BUNDLES


@pytest.mark.parametrize("bundle", DEMO_BUNDLES)
def test_every_run_page_loads_cleanly_with_charts(live, page, bundle: str) -> None:
    url, runs = live
    run_id = runs[bundle]
    open_page(page, f"{url}/runs/{run_id}")
    drawn = charts(page)
    assert "chart-helper_launches" in drawn, run_id
    for chart_id, chart in drawn.items():
        assert chart["traces"] and chart["svgTraces"] > 0, (run_id, chart_id)
    assert page.locator("#findings article.finding").count() >= 1


def test_arm_comparison_shows_the_padding_helper_disappearing(live, page) -> None:
    url, _ = live
    run_id = _arms_run(url)
    open_page(page, f"{url}/runs/{run_id}")
    with page.expect_navigation():
        page.click(f"a.arm-compare[href$='{ARMS}']")
    page.wait_for_selector("body[data-charts-ready='true']")
    assert page.errors == []
    twin = page.request.get(f"{url}/compare/{run_id}/{run_id}.json?{ARMS}").json()
    helper = next(h for h in twin["changed_helpers"] if h["helper"] == "get_cu_seqlens_on_cp_rank")
    # the traces README: 48 launches per rank over 3 steps, all in auto_clone -> 32 per step
    assert (helper["base_launches"], helper["head_launches"]) == (32.0, 0.0)
    row = page.locator("#helper-deltas-table tr[data-helper='get_cu_seqlens_on_cp_rank']")
    assert row.inner_text().split("\t")[2:5] == ["32.0", "0.0", "-32.0"]
    median = page.locator("#deltas-table tr[data-metric='iteration time, median']").inner_text()
    assert f"{twin['metrics'][0]['delta']:+,.3f}" in median
    assert page.inner_text("#verdict-summary") == twin["report"]["summary"]
    drawn = charts(page)
    assert drawn["chart-helper_deltas"]["points"][0] == len(twin["changed_helpers"])
    assert len(drawn["chart-distributions"]["traces"]) == 2


def test_history_and_catalog_of_the_real_service(live, page) -> None:
    url, _ = live
    open_page(page, f"{url}/history")  # the first configuration is picked
    assert charts(page)["chart-history"]["traces"][-1] == "iteration_median_ms"
    open_page(page, f"{url}/catalog")
    assert page.locator("#catalog-table tr[data-helper='cp_attention.metadata']").count() == 1


def test_pr_comment_cli_against_the_real_service(live) -> None:
    url, _ = live
    run_id = _arms_run(url)
    result = CliRunner().invoke(cli_app, [
        "pr-comment", "--base", str(run_id), "--head", str(run_id), "--server", url,
        "--base-window", "arm:auto_clone", "--head-window", "arm:explicit_false",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| `get_cu_seqlens_on_cp_rank` | metadata | 32.0 | 0.0 | -32.0 |" in result.output
    assert f"({url}/compare/{run_id}/{run_id}?{ARMS})" in result.output


def test_screenshot_script_saves_a_png_of_every_page(live, tmp_path) -> None:
    url, _ = live
    # A subprocess, as a user runs it (and the page fixture's Playwright owns this thread's loop).
    cli = "from cptrace.cli import main; main()"
    args = [sys.executable, "-c", cli, "screenshots", "--server", url, "--out", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 5
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["catalog.png", "compare.png", "history.png", "run.png", "runs.png"]
    for png in tmp_path.iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
