"""Pages and their JSON twins over an in-memory store (no database, no browser)."""

from __future__ import annotations

import json
import re

import pytest
import web_factories as f
from fastapi.testclient import TestClient
from web_fake_store import demo_store, make_app

from web.routes import plotly_js_path


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(make_app(demo_store()))


def _figures(html: str) -> dict[str, dict]:
    """The figure JSON blocks of a page, parsed as the browser would."""
    blocks = re.findall(
        r'<script type="application/json" id="fig-([a-z_]+)">(.*?)</script>', html, flags=re.S
    )
    return {name: json.loads(body) for name, body in blocks}


def test_every_page_has_a_json_twin_built_from_the_same_data(client: TestClient) -> None:
    for path in ("/runs", "/runs/1", "/compare/1/2", "/history", "/catalog"):
        html = client.get(path)
        assert html.status_code == 200, path
        assert html.headers["content-type"].startswith("text/html")
        twin = client.get(path + ".json")
        assert twin.status_code == 200, path
        assert twin.headers["content-type"] == "application/json"
        assert f'href="{path}.json"' in html.text  # the page links its twin
        for name, fig in _figures(html.text).items():
            assert twin.json()["figures"][name] == fig, (path, name)


def test_runs_list_filters_sorts_and_pages(client: TestClient) -> None:
    page = client.get("/runs.json").json()
    assert [r["id"] for r in page["runs"]] == [9, 8, 7, 6, 5, 4, 3, 2, 1]  # newest first
    assert page["runs"][0]["verdict"] == "clean" and page["runs"][1]["verdict"] == "pending"
    te = client.get("/runs.json?implementation=te").json()
    assert {r["id"] for r in te["runs"]} == {1, 3, 5, 7}
    feature = client.get("/runs.json?branch=feature/x&verdict=pending").json()
    assert [r["id"] for r in feature["runs"]] == [8]
    by_median = client.get("/runs.json?sort=median_ms&order=asc").json()["runs"]
    assert [r["id"] for r in by_median][:3] == [9, 7, 6] and by_median[-1]["id"] == 8  # None last
    dated = client.get("/runs.json?date_from=2026-11-03&date_to=2026-11-04").json()
    assert [r["id"] for r in dated["runs"]] == [4, 3]
    assert client.get("/runs.json?commit=05").json()["runs"][0]["id"] == 5
    paged = client.get("/runs.json?per_page=4&page=3").json()
    assert [r["id"] for r in paged["runs"]] == [1] and paged["total"] == 9
    assert page["options"]["implementation"] == ["bundled", "te"]


def test_runs_page_links_keep_filters_and_toggle_sort(client: TestClient) -> None:
    html = client.get("/runs?branch=main&sort=median_ms&order=desc&per_page=3").text
    assert 'href="/runs?branch=main&amp;sort=median_ms&amp;order=asc&amp;per_page=3"' in html
    assert 'href="/runs?branch=main&amp;sort=id&amp;order=desc&amp;per_page=3"' in html
    assert 'rel="next"' in html and 'rel="prev"' not in html
    assert '<option value="main" selected>main</option>' in html


def test_bad_parameters_are_400_in_both_shapes(client: TestClient) -> None:
    twin = client.get("/runs.json?sort=evil")
    assert twin.status_code == 400
    assert twin.json()["ok"] is False and "sort must be one of" in twin.json()["error"]
    page = client.get("/runs?sort=evil")
    assert page.status_code == 400 and "sort must be one of" in page.text
    assert client.get("/runs?page=0").status_code == 400


def test_unknown_windows_and_out_of_range_ids_are_client_errors(client: TestClient) -> None:
    twin = client.get("/compare/1/1.json?base_window=arm:nope&head_window=arm:auto_clone")
    assert twin.status_code == 400 and "window 'arm:nope' not in the report" in twin.json()["error"]
    page = client.get("/compare/1/1?base_window=arm:nope")
    assert page.status_code == 400 and "arm:nope" in page.text
    assert client.get("/compare/1/1?base_window=" + "x" * 201).status_code == 422
    assert client.get(f"/runs/{2**63}.json").status_code == 422  # beyond SQLite's integers
    assert client.get("/runs/0").status_code == 422


def test_unknown_and_unanalysed_runs(client: TestClient) -> None:
    assert client.get("/runs/99").status_code == 404
    assert "run 99 does not exist" in client.get("/runs/99").text
    assert client.get("/runs/99.json").json()["status"] == 404
    pending = client.get("/runs/8")
    assert pending.status_code == 200 and "No analysis result yet" in pending.text
    assert client.get("/runs/8.json").json()["figures"] == {}
    conflict = client.get("/compare/1/8")
    assert conflict.status_code == 409 and "no analysis result yet" in conflict.text


def test_run_page_shows_findings_charts_and_escapes_template_names(client: TestClient) -> None:
    html = client.get("/runs/1").text
    assert "Padded THD path taken without padding" in html
    assert "Pass pad_between_seqs=False to DotProductAttention &lt;fast path&gt;." in html
    assert "<code>zero_fill&lt;dQ&gt;</code>" in html and "zero_fill<dQ>" not in html
    assert "TE issue #3331" in html
    figs = _figures(html)
    assert set(figs) == {
        "iterations",
        "helper_launches",
        "helper_time",
        "category_time",
        "timeline",
    }
    # the JSON in the script block can never close the block or open a tag
    raw = html.split('id="fig-timeline">', 1)[1].split("</script>", 1)[0]
    assert "<" not in raw and "\\u003c" in raw
    assert (
        'href="/compare/1/1?base_window=arm%3Aauto_clone&amp;head_window=arm%3Aexplicit_false"'
        in html
    )


def test_comparison_page_shows_deltas_verdict_and_markdown(client: TestClient) -> None:
    twin = client.get("/compare/1/2.json").json()
    assert twin["report"]["verdict"] == "faster"
    median = twin["metrics"][0]
    assert median["metric"] == "iteration time, median" and median["significance"] == "significant"
    assert [h["helper"] for h in twin["changed_helpers"]] == [
        f.TEMPLATE_HELPER,
        "get_cu_seqlens_on_cp_rank",
    ]
    assert twin["markdown"].startswith("<!-- cptrace:suite=preview -->")
    assert "http://testserver/compare/1/2" in twin["markdown"]
    html = client.get("/compare/1/2").text
    assert f'<p class="summary" id="verdict-summary">{twin["report"]["summary"]}</p>' in html
    assert '<td class="num delta better">-56.0</td>' in html
    assert "<code>zero_fill&lt;dQ&gt;</code>" in html
    assert set(_figures(html)) == {"distributions", "helper_deltas"}
    redirect = client.get("/compare?base=1&head=2", follow_redirects=False)
    assert redirect.status_code == 303 and redirect.headers["location"] == "/compare/1/2"


def test_history_has_noise_band_and_flags_the_step_change(client: TestClient) -> None:
    twin = client.get("/history.json").json()
    assert twin["config_key"] == "other"  # first configuration when none is asked for
    assert twin["points"] == [] and twin["options"]["config_key"] == ["other", "ref-2xh200"]
    twin = client.get("/history.json?config_key=ref-2xh200").json()
    rows = twin["points"]
    assert [r["band_low"] is None for r in rows[:3]] == [True, True, True]
    assert rows[5]["outside_band"] is True  # 21.3 -> 18.6 is far outside the noise
    assert rows[4]["outside_band"] is False
    _band, line = twin["figures"]["history"]["data"]
    assert line["y"] == [21.3, 21.2, 21.4, 21.3, 21.25, 18.6, 18.7]
    # runs 1-5 have a stored p10/p90: error bars; runs 6-7 do not: zero-length bars
    assert line["error_y"]["array"] == pytest.approx([0.3] * 5 + [0, 0])
    assert line["error_y"]["arrayminus"] == pytest.approx([0.2] * 5 + [0, 0])
    html = client.get("/history?config_key=ref-2xh200").text
    assert "outside band" in html


def test_catalog_page_lists_helpers(client: TestClient) -> None:
    twin = client.get("/catalog.json").json()
    names = [h["name"] for h in twin["helpers"]]
    assert "cp_attention.metadata" in names and twin["version"]
    html = client.get("/catalog").text
    assert "<code>cp_attention.metadata</code>" in html


def test_plotly_is_served_locally_and_no_page_uses_a_cdn(client: TestClient) -> None:
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) == plotly_js_path().stat().st_size
    assert client.get("/static/cptrace.js").status_code == 200
    assert client.get("/static/cptrace.css").status_code == 200
    assert client.get("/static/..%2Fdata.py").status_code == 404
    assert client.get("/static/missing.js").status_code == 404
    for path in ("/runs", "/runs/1", "/compare/1/2", "/history", "/catalog"):
        html = client.get(path).text
        assert "cdn" not in html.lower() and "https://" not in html
    assert '<script src="/static/plotly.min.js" defer></script>' in client.get("/runs/1").text
    assert "plotly.min.js" not in client.get("/runs").text  # no charts, no 4 MB download
