"""Unrelated runs over the real store: the comparability issues on the compare page and in its
PR comment, and the history page keeping bundled and TE runs apart with readable names.

Two real demo bundles (2x H200) whose manifests carry the same workload block, hence one
configuration hash: the bundled CP attention's fixed-vs-broken arms, and TE 2.20.2 stock vs the
TE adapter (each variant overrides the implementation).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from stored_runs import assert_analysed, drain_worker, upload_bundles

from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

DEMO = Path(__file__).resolve().parents[2] / "demo" / "bundles"
BUNDLES = {
    "bundled": DEMO / "bundled-fixed-vs-broken-h200x2.tar.gz",
    "te": DEMO / "te-2.20.2-adapter-vs-stock-h200x2.tar.gz",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("comparability"), ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, BUNDLES)
        drain_worker(settings)
        assert_analysed(client, ids)
        yield {"client": client, **ids}


def test_compare_page_and_comment_show_the_typed_issues(runs: dict[str, Any]) -> None:
    client = runs["client"]
    path = f"/compare/{runs['bundled']}/{runs['te']}"
    params = {"base_window": "arm:fixed", "head_window": "arm:te_stock"}
    page = client.get(f"{path}.json", params=params).json()
    issues = page["report"]["comparability"]
    impl = next(i for i in issues if i["aspect"] == "implementation")
    assert (impl["base"], impl["head"], impl["refuses_time_verdict"]) == ("bundled", "te", True)
    assert page["report"]["verdict"] == "inconclusive"
    assert "**implementation** (no time verdict): different implementations" in page["markdown"]
    html = client.get(path, params=params).text
    assert 'data-aspect="implementation"' in html and "no time verdict</span>" in html
    # the same run's two arms: the variants declare the implementation, no issue
    same = client.get(
        f"/compare/{runs['te']}/{runs['te']}.json",
        params={"base_window": "arm:te_stock", "head_window": "arm:te_adapter"},
    ).json()
    assert same["report"]["comparability"] == [] and "Comparability" not in same["markdown"]


def test_history_keeps_implementations_apart_with_readable_names(runs: dict[str, Any]) -> None:
    client = runs["client"]
    keys = {client.get(f"/api/v1/runs/{runs[k]}").json()["config_key"] for k in BUNDLES}
    [config] = keys  # one configuration hash for both: today's history mixed them
    page = client.get("/history.json", params={"metric": "findings"}).json()
    groups = {g["implementation"]: g for g in page["groups"] if g["config_key"] == config}
    assert set(groups) == {"bundled", "te, te-adapter"}
    name = groups["bundled"]["name"]
    assert name.startswith("bundled · bundled-fixed-vs-broken · p2p dual_chunk_swap cp 2")
    assert "seqlens 8192/4096/2048/2048" in name and name.endswith(config[:8])
    for impl, key in (("bundled", "bundled"), ("te, te-adapter", "te")):
        series = client.get(
            "/history.json",
            params={"config_key": config, "implementation": impl, "metric": "findings"},
        ).json()
        assert [r["point"]["run_id"] for r in series["points"]] == [runs[key]]
        assert series["implementation"] == impl
        assert series["title"] == f"History of findings: {impl} runs of configuration {config[:8]}"
        assert series["series"] == groups[impl]["name"]
        x = series["figures"]["history"]["data"][-1]["x"]
        assert x == [f"1: {series['points'][0]['point']['name']}"]  # no commit recorded
    # the implementation selector alone picks that implementation's first configuration
    picked = client.get("/history.json", params={"implementation": "te, te-adapter"}).json()
    assert (picked["config_key"], picked["implementation"]) == (config, "te, te-adapter")
    html = client.get("/history", params={"config_key": config, "implementation": "bundled"}).text
    assert '<h1 id="history-title">History of iteration_median_ms: bundled runs of' in html
    assert f'<p class="summary" id="history-series">{groups["bundled"]["name"]}</p>' in html
    assert f">{groups['bundled']['name']} (1 run, 0 commits)</option>" in html
    assert "over commits" not in html


def test_the_bundled_demo_run_says_it_used_the_earlier_kernels(runs: dict[str, Any]) -> None:
    """The bundled capture (earlier flash local kernels) carries its caveat to its run page and
    the history (manifest ``run.caveat``); the TE run has none."""
    client = runs["client"]
    bundled = client.get(f"/runs/{runs['bundled']}.json").json()
    assert bundled["caveat"].startswith("Captured with the earlier flash local kernels")
    assert "benchmarks/RESULTS.md" in bundled["caveat"]  # the one-GPU floor results
    assert client.get(f"/runs/{runs['te']}.json").json()["caveat"] is None
    html = client.get(f"/runs/{runs['bundled']}").text
    assert '<p class="caveat" id="caveat"><strong>Caveat:</strong> Captured with' in html
    config = client.get(f"/api/v1/runs/{runs['bundled']}").json()["config_key"]
    params = {"config_key": config, "implementation": "bundled", "metric": "findings"}
    series = client.get("/history.json", params=params).json()
    [row] = series["points"]
    assert row["point"]["caveat"] == bundled["caveat"]
    assert "caveat: Captured with" in series["figures"]["history"]["data"][-1]["hovertext"][0]
    page = client.get("/history", params=params).text
    assert 'class="badge caveat"' in page
