"""The step account on the run and comparison pages, from a real analysis (nsys 3-arm trace)."""

from __future__ import annotations

import re

import plotly.graph_objects as go
import pytest
from fastapi.testclient import TestClient
from web_fake_store import FakeStore, _summary, make_app

from analyzers import compare_reports
from analyzers.pipeline import analyze
from analyzers.report import AnalysisReport
from tests.analyzers.conftest import NSYS_3ARMS, te_manifest
from web import figures

PARTS = set(figures.ACCOUNT_COLORS)


@pytest.fixture(scope="module")
def report() -> AnalysisReport:
    return analyze(NSYS_3ARMS, manifest=te_manifest("nsys_arm", steps_per_window=3))


def test_account_bars_stack_parts_per_group_and_rank(report: AnalysisReport) -> None:
    fig = figures.account_bars(report.accounts)
    go.Figure(fig)
    assert {t["name"] for t in fig["data"]} <= PARTS
    rows = fig["data"][0]["y"]
    assert len(rows) == 6 and not any("whole trace" in y for y in rows)  # 3 arms x 2 ranks
    for i, y in enumerate(rows):
        group, rank = y.split(" · rank ")
        (acc,) = [a for a in report.accounts if a.window == group and a.rank == int(rank)]
        total = sum(t["x"][i] for t in fig["data"])
        assert total == pytest.approx(acc.span_ns / acc.steps / 1e6)


def test_run_and_compare_pages_show_the_account(report: AnalysisReport) -> None:
    store = FakeStore()
    store.runs[1] = _summary(1)
    store.reports[1] = report
    store.comparison = compare_reports(
        report, report, base_window="nsys_arm:auto_clone", head_window="nsys_arm:explicit_false"
    )
    client = TestClient(make_app(store))
    page = client.get("/runs/1").text
    assert 'id="account"' in page and 'id="fig-account"' in page
    causes = re.search(r'<table class="idle-causes".*?</table>', page, flags=re.S)
    assert causes is not None and "get_cu_seqlens_on_cp_rank" in causes.group(0)
    twin = client.get("/runs/1.json").json()
    causes_json = twin["idle_causes"]
    assert [c["window"] for c in causes_json] == [
        g for g in ("nsys_arm:auto_clone", "nsys_arm:explicit_false", "nsys_arm:auto_same")
        for _ in range(5)
    ]
    first = [c["ms_per_step"] for c in causes_json[:5]]
    assert first == sorted(first, reverse=True)
    go.Figure(twin["figures"]["account"])
    compare = client.get("/compare/1/1").text
    assert 'id="account-delta"' in compare and "get_cu_seqlens_on_cp_rank" in compare
    go.Figure(client.get("/compare/1/1.json").json()["figures"]["account_delta"])
