"""The run page's step timeline with its idle gaps, over the real store.

Real bundles are uploaded to the real service, analysed by the real worker, and the run page is
read back: the timeline figure must draw each rank's idle gaps (the step account's idle pieces
of the drawn window, coloured by cause and labelled "cause: helper duration"), and the top idle
causes must link to the timeline at their gap. The CPU bundle (gloo, no GPU activity) must draw
neither a GPU timeline nor an account, and say "not observed".
"""

from __future__ import annotations

import html
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
from fastapi.testclient import TestClient
from stored_runs import assert_analysed, drain_worker, upload_bundles
from testkit import DATA_DIR, demo_bundle

from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings
from web import figures

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[2]
NSYS_BUNDLE = demo_bundle("te-2.20.2-nsys-3arms")
CPU_BUNDLE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"
SETTINGS: list[Settings] = []  # the store's settings, for the browser test's own server
IDLE_PARTS = {
    "idle: host-bound",
    "idle: synchronisation",
    "idle: waiting on another rank",
    "idle: other",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, int]]]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("gaps"), ingest_workers=0)
    SETTINGS.append(settings)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, {"nsys": NSYS_BUNDLE, "cpu": CPU_BUNDLE})
        drain_worker(settings)
        assert_analysed(client, ids)
        yield client, ids


def _stored_report(client: TestClient, run_id: int) -> dict[str, Any]:
    """The whole report the worker stored (the page reads only its page summary)."""
    resp = client.get(f"/api/v1/runs/{run_id}/analysis/result")
    assert resp.status_code == 200, resp.text
    report: dict[str, Any] = resp.json()
    return report


def _figure(page: str, name: str) -> dict[str, Any]:
    block = re.search(
        rf'<script type="application/json" id="fig-{name}">(.*?)</script>', page, flags=re.S
    )
    assert block is not None, f"no figure {name}"
    figure: dict[str, Any] = figures.expand_figure(json.loads(html.unescape(block.group(1))))
    return figure


def test_timeline_draws_the_labelled_idle_gaps_of_the_drawn_step(
    store: tuple[TestClient, dict[str, int]],
) -> None:
    client, ids = store
    page = client.get(f"/runs/{ids['nsys']}").text
    data = client.get(f"/runs/{ids['nsys']}.json").json()
    report = _stored_report(client, ids["nsys"])
    drawn_timelines = [report["timeline"], *report["other_timelines"]]
    assert len(drawn_timelines) == len(data["timelines"]) == 3  # one per arm
    for (name, _), timeline in zip(data["timelines"], drawn_timelines, strict=True):
        _check_timeline(_figure(page, name), timeline, report)


def _check_timeline(fig: dict[str, Any], timeline: dict[str, Any], report: dict[str, Any]) -> None:
    go.Figure(fig)  # a valid plotly figure
    gaps = [t for t in fig["data"] if t.get("legendgroup") == "idle gaps"]
    assert gaps and {t["name"] for t in gaps} <= IDLE_PARTS
    drawn = {(s["rank"], s["window"], s["index"]) for s in timeline["steps"]}
    assert {r for r, _, _ in drawn} == set(report["ranks"])
    # what the figure draws, per (rank, cause, helper), in ns, from its labels and bar widths
    seen: dict[tuple[int, str, str], float] = defaultdict(float)
    for trace in gaps:
        # plotly writes the duration: the bar's width in ms, 3 decimals (cptrace.js and
        # Chromium: test_gap_labels_and_hovers_read_as_before_in_chromium)
        assert trace["texttemplate"] == "%{text} %{x:.3f} ms"
        assert trace["hovertemplate"].startswith("<b>%{hovertext} %{customdata:.3f} ms</b>")
        assert trace["customdata"] == trace["x"]  # (sent once: "copies")
        for y, label, short, width in zip(
            trace["y"], trace["hovertext"], trace["text"], trace["x"], strict=True
        ):
            rank = int(re.fullmatch(r"rank (\d+) · idle gaps", y).group(1))  # type: ignore[union-attr]
            assert label == f"{trace['name']}: {short}"  # helper on the bar, cause in the hover
            seen[(rank, trace["name"], short)] += width * 1e6
    # ... equals the stored step account's idle parts of exactly those windows
    account: dict[tuple[int, str, str], int] = defaultdict(int)
    for step in report["step_accounts"]:
        if step["window"] != timeline["window"]:
            continue
        if (step["rank"], step["name"], step["index"]) not in drawn:
            continue
        for part in step["parts"]:
            if part["part"] in IDLE_PARTS and part["time_ns"]:
                account[(step["rank"], part["part"], part["label"])] += part["time_ns"]
    assert timeline["gaps_dropped"] == 0
    assert set(seen) == set(account)
    for key, ns in account.items():
        assert seen[key] == pytest.approx(ns, rel=1e-6, abs=2e3), key
    helper = ("idle: host-bound", "get_cu_seqlens_on_cp_rank")
    padded = any(k[1:] == helper for k in seen)
    assert padded == (timeline["window"] == "nsys_arm:auto_clone"), "padded path's gaps drawn"
    # the gaps sit on their own row above each rank's streams
    order = fig["layout"]["yaxis"]["categoryarray"]
    for rank in report["ranks"]:
        row = order.index(f"rank {rank} · idle gaps")
        streams = [i for i, y in enumerate(order) if y.startswith(f"rank {rank} · stream")]
        assert streams and row == max(streams) + 1  # categoryarray runs bottom-up


def test_idle_causes_link_to_the_timeline_at_their_gap(
    store: tuple[TestClient, dict[str, int]],
) -> None:
    client, ids = store
    page = client.get(f"/runs/{ids['nsys']}").text
    data = client.get(f"/runs/{ids['nsys']}.json").json()
    report = _stored_report(client, ids["nsys"])
    timelines = [report["timeline"], *report["other_timelines"]]
    # one drawn timeline per step group, each chart on the page
    assert [g for _, g in data["timelines"]] == [t["window"] for t in timelines]
    assert len(timelines) == 3
    charts = {group: name for name, group in data["timelines"]}
    links = re.findall(
        r'<a class="timeline-zoom" href="#(timeline(?:_\d+)?)@([0-9.]+)-([0-9.]+)" '
        r'data-chart="chart-(timeline(?:_\d+)?)" data-x0="([0-9.]+)" data-x1="([0-9.]+)" '
        r'title="([^"]*)">',
        page,
    )
    zoomed = [c for c in data["idle_causes"] if c["zoom"]]
    assert len(links) == len(zoomed) == len(data["idle_causes"])  # every cause is drawn
    for cause, (name, h0, h1, chart, x0, x1, title) in zip(zoomed, links, strict=True):
        zoom = cause["zoom"]
        assert name == chart == zoom["chart"] == charts[cause["window"]]
        assert float(h0) == pytest.approx(float(x0)) and float(h1) == pytest.approx(float(x1))
        assert html.unescape(title) == zoom["text"]
        assert zoom["text"].startswith(f"{cause['part']}: {cause['label']} ")
        fig = _figure(page, chart)
        assert fig["layout"]["title"]["text"].startswith(f"Timeline of {cause['window']}")
        # the link's range holds a drawn gap of that cause on that rank, the cause's longest
        mine = [
            (base, width)
            for t in fig["data"]
            if t.get("legendgroup") == "idle gaps"
            for y, text, base, width in zip(t["y"], t["hovertext"], t["base"], t["x"], strict=True)
            if y == f"rank {cause['rank']} · idle gaps"
            and text == f"{cause['part']}: {cause['label']}"
        ]
        longest = max(mine, key=lambda g: g[1])
        assert longest[0] == pytest.approx(zoom["x0_ms"])
        assert float(x0) <= longest[0] and longest[0] + longest[1] <= float(x1) + 1e-9


def test_cpu_run_page_draws_no_gpu_figures_and_says_not_observed(
    store: tuple[TestClient, dict[str, int]],
) -> None:
    client, ids = store
    page = client.get(f"/runs/{ids['cpu']}").text
    assert "Not observed: no GPU activity in this trace." in page
    for name in ("gpu_timeline", "account", "timeline"):
        assert f'id="fig-{name}"' not in page
    assert 'id="idle-causes"' not in page and 'class="imbalance"' not in page
    ranks = re.search(r'<table class="ranks">.*?</table>', page, flags=re.S)
    assert ranks is not None and "not observed" in ranks.group(0)  # no "GPU busy 0"
    table = re.search(r'<table class="host-time sortable".*?</table>', page, flags=re.S)
    assert table is not None
    assert "get_cu_seqlens_on_cp_rank" in table.group(0)
    assert "cp_attention.grad_zero_fill" in table.group(0)
    data = client.get(f"/runs/{ids['cpu']}.json").json()
    assert data["gpu_observed"] is False
    rules = {f["rule"] for f in data["findings"]}
    assert {"padded-path-without-padding", "zero-fill-without-padding", "gpu-not-observed"} <= rules


def test_cpu_comparison_says_not_observed_instead_of_gpu_zeros(
    store: tuple[TestClient, dict[str, int]],
) -> None:
    client, ids = store
    run = ids["cpu"]
    params = {"base_window": "arm:fixed", "head_window": "arm:broken"}
    page = client.get(f"/compare/{run}/{run}", params=params)
    assert page.status_code == 200, page.text
    text = page.text
    assert "not observed: no GPU activity in the base and the head trace" in text
    for section in (
        'id="total-gpu"',
        'id="helper-deltas"',
        'id="fig-account_delta"',
        'id="fig-gpu_timeline"',
    ):
        assert section not in text
    data = client.get(f"/compare/{run}/{run}.json", params=params).json()
    assert data["report"]["gpu_observed"] is False
    assert any("no GPU activity in the base and head trace" in n for n in data["report"]["notes"])


def _load(page: Any, url: str) -> None:
    """Like ``web_browser.open_page`` with room for a loaded machine: the page draws one
    timeline per arm (thousands of bars each)."""
    page.errors.clear()
    response = page.goto(url, wait_until="domcontentloaded", timeout=180_000)
    assert response is not None and response.status == 200, url
    page.wait_for_selector("body[data-charts-ready='true']", timeout=180_000)
    assert page.errors == [], page.errors


@dataclass
class DrawnRunPage:
    """The nsys run page in one Chromium page, served by one uvicorn app for the module's
    browser tests (a Chromium start and a page load are most of their CPU). A test that only
    reads the drawn page takes ``as_drawn()``; one that zooms or navigates takes ``to_change()``,
    and the next reader gets a fresh load."""

    page: Any
    url: str
    changed: bool = True  # nothing loaded yet

    def as_drawn(self) -> Any:
        if self.changed:
            _load(self.page, self.url)
            self.changed = False
        self.page.errors.clear()
        return self.page

    def to_change(self) -> Any:
        page = self.as_drawn()
        self.changed = True
        return page


@pytest.fixture(scope="module")
def drawn_run_page(store: tuple[TestClient, dict[str, int]]) -> Iterator[DrawnRunPage]:
    from web_browser import browser_page, require_chromium
    from web_server import serve

    require_chromium()
    _, ids = store
    # a second app over the same data directory, under uvicorn, for the browser
    with serve(create_app(SETTINGS[-1])) as url, browser_page() as page:
        yield DrawnRunPage(page, f"{url}/runs/{ids['nsys']}")


_DRAWN = """name => {
  const el = document.getElementById('chart-' + name);
  return el.data.map(t => ({name: t.name, y: t.y, hovertext: t.hovertext, text: t.text || null}));
}"""
_HOVER = """async ([name, curve, point]) => {
  const el = document.getElementById('chart-' + name);
  Plotly.Fx.unhover(el);
  await new Promise(done => setTimeout(done, 120));  // plotly throttles hovers (50 ms)
  Plotly.Fx.hover(el, [{curveNumber: curve, pointNumber: point}]);
  const texts = Array.from(el.querySelectorAll('.hoverlayer .hovertext text'));
  return texts.map(t => Array.from(t.querySelectorAll('tspan.line')).map(s => s.textContent)
    .join('\\n') || t.textContent).join('\\n');
}"""
_BAR_TEXTS = """name => Array.from(
  document.getElementById('chart-' + name).querySelectorAll('.barlayer .trace')
).map(g => Array.from(g.querySelectorAll('.bartext')).map(t => t.textContent))"""


@pytest.mark.browser
def test_gap_labels_and_hovers_read_as_before_in_chromium(
    store: tuple[TestClient, dict[str, int]], drawn_run_page: DrawnRunPage
) -> None:
    """The page sends each name once; in Chromium the timeline shows the texts it showed when
    every bar carried its own: each kernel's name in its hover, "cause: helper 1.234 ms" in a
    gap's hover and "helper 1.234 ms" on the bar (from the stored account: _check_timeline)."""
    client, ids = store
    html_page = client.get(f"/runs/{ids['nsys']}").text
    fig = _figure(html_page, "timeline")  # expanded by figures.expand_figure
    page = drawn_run_page.as_drawn()  # hovers only: the zoom test below reuses this load
    drawn = page.evaluate(_DRAWN, "timeline")
    # what cptrace.js handed plotly is what expand_figure makes of the page's figure
    assert drawn == [{k: t.get(k) for k in ("name", "y", "hovertext", "text")} for t in fig["data"]]
    bar_texts = page.evaluate(_BAR_TEXTS, "timeline")
    for curve, trace in enumerate(fig["data"]):
        widths = trace["x"]
        if trace.get("legendgroup") == "idle gaps":
            labels = [
                html.unescape(f"{short} {w:.3f} ms")
                for short, w in zip(trace["text"], widths, strict=True)
            ]
            shown = [t for t in bar_texts[curve] if t]
            assert shown and set(shown) <= set(labels), trace["name"]
            expected = [html.unescape(f"{trace['hovertext'][0]} {widths[0]:.3f} ms")]
            expected.append(f"start {trace['base'][0]:.3f} ms")
        else:
            expected = [
                html.unescape(trace["name"]),
                html.unescape(trace["hovertext"][0]),
                f"start {trace['base'][0]:.3f} ms, {widths[0]:.4f} ms",
            ]
        assert page.evaluate(_HOVER, ["timeline", curve, 0]) == "\n".join(expected)
    assert page.errors == [], page.errors


@pytest.mark.browser
def test_a_cause_link_zooms_the_drawn_timeline_in_chromium(
    drawn_run_page: DrawnRunPage,
) -> None:
    zoomed = "name => document.getElementById('chart-' + name).dataset.zoom"
    shown = "name => document.getElementById('chart-' + name).layout.xaxis.range"
    page = drawn_run_page.to_change()
    link = page.locator("a.timeline-zoom").last  # a cause of the last arm's timeline
    chart = (link.get_attribute("data-chart") or "").removeprefix("chart-")
    assert chart == "timeline_2"
    x0, x1 = float(link.get_attribute("data-x0")), float(link.get_attribute("data-x1"))
    link.click()
    page.wait_for_function(zoomed, arg=chart)
    assert page.evaluate(shown, chart) == pytest.approx([x0, x1])
    assert page.evaluate(shown, "timeline") != pytest.approx([x0, x1])  # only that chart
    assert page.url.endswith(link.get_attribute("href") or "?")
    # the fragment alone zooms too (a shared link), on a fresh load
    page.goto("about:blank")
    _load(page, f"{drawn_run_page.url}#timeline@1.0000-2.0000")
    page.wait_for_function(zoomed, arg="timeline")
    assert page.evaluate(shown, "timeline") == pytest.approx([1.0, 2.0])
    assert page.errors == [], page.errors
