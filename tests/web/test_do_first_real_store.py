"""The "do this first" block on the run page, its JSON twin and the PR comment (issue 25).

The real CPU gloo bundle (``cpu_smoke``: its ``broken`` arm runs the padded path without
padding) uploaded to the real service and analysed by the real worker. The run page, its JSON
twin and the comparison's PR-comment preview must show the actions the analysis computed
(``cptrace analyze`` of the same bundle, in process), with their saving and evidence; the compact
summary names the run's top CPU op and its communication share.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape
from stored_runs import assert_analysed, drain_worker, upload_bundles
from testkit import DATA_DIR, demo_bundle

from analyzers.compare import compare_reports
from analyzers.pipeline import analyze
from analyzers.report import Action, AnalysisReport
from cptrace.app import create_app
from pr_bot.comment import CommentContext, render_comment
from service.auth import Role, create_token
from service.core.config import Settings

ROOT = Path(__file__).resolve().parents[2]
CPU_BUNDLE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"
TE_BUNDLE = demo_bundle("te-2.20.2-nsys-3arms")
BASE_WINDOW, HEAD_WINDOW = "arm:fixed", "arm:broken"


@dataclass
class Stored:
    client: TestClient
    run_id: int
    report: AnalysisReport


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    root = tmp_path_factory.mktemp("do-first")
    settings = Settings(data_dir=root / "data", ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, {"smoke": CPU_BUNDLE})
        drain_worker(settings)
        assert_analysed(client, ids)
        yield Stored(client, ids["smoke"], analyze(CPU_BUNDLE))


def _actions(report: AnalysisReport) -> list[Action]:
    assert report.summary is not None
    actions = report.summary.do_first
    assert 0 < len(actions) <= 3
    return actions


def test_run_page_and_json_twin_show_do_this_first(stored: Stored) -> None:
    expected = _actions(stored.report)
    page: dict[str, Any] = stored.client.get(f"/runs/{stored.run_id}.json").json()
    assert [Action.model_validate(a) for a in page["do_first"]] == expected
    body = stored.client.get(f"/runs/{stored.run_id}").text
    section = body[body.index('id="do-first"') : body.index('id="findings"')]
    assert body.index('id="do-first"') < body.index('id="findings"')  # at the top
    assert section.count("<li>") == len(expected)
    for a in expected:
        assert escape(a.action) in section and escape(a.evidence) in section
        if a.saving_text:
            assert a.saving_text in section
    assert "padded-path-without-padding" in {a.rule for a in expected}


def test_run_page_has_a_compact_summary(stored: Stored) -> None:
    full = stored.report.summary
    assert full is not None and full.communication_share is not None
    page = stored.client.get(f"/runs/{stored.run_id}.json").json()
    compact = page["summary"]
    assert compact["cpu_ops"] == [r.model_dump(mode="json") for r in full.cpu_ops[:5]]
    assert len(compact["cpu_ops"]) == min(5, len(full.cpu_ops)) > 0
    body = stored.client.get(f"/runs/{stored.run_id}").text
    summary = body[body.index('id="summary"') : body.index('id="findings"')]
    assert escape(full.cpu_ops[0].name) in summary
    assert f"Communication share: {100 * full.communication_share:.1f}%" in summary


def test_pr_comment_preview_carries_the_heads_do_this_first(stored: Stored) -> None:
    expected = _actions(stored.report)
    url = f"/compare/{stored.run_id}/{stored.run_id}.json"
    resp = stored.client.get(url, params={"base_window": BASE_WINDOW, "head_window": HEAD_WINDOW})
    assert resp.status_code == 200, resp.text
    markdown = resp.json()["markdown"]
    assert "Do this first (head)" in markdown
    assert markdown.index("Do this first (head)") < markdown.index("| metric |")
    for i, a in enumerate(expected, 1):
        assert f"{i}. **" in markdown and a.evidence.split(" (")[0] in markdown


def test_comment_render_names_saving_and_evidence() -> None:
    """The comment of a comparison of two windows of a real TE 2.20.2 nsys capture: one line
    per action, in order, with its estimated saving."""
    report = analyze(TE_BUNDLE)
    comparison = compare_reports(
        report, report, base_window="nsys_arm:auto_clone", head_window="nsys_arm:explicit_false"
    )
    assert any(a.saving_ms for a in comparison.do_first_head)
    assert comparison.do_first_head == _actions(report)
    context = CommentContext(suite="smoke", base_name="base", head_name="head")
    lines = render_comment(comparison, context).splitlines()
    start = lines.index("#### Do this first (head)")
    items = [line for line in lines[start + 1 : start + 6] if line[:2] in ("1.", "2.", "3.")]
    assert len(items) == len(comparison.do_first_head)
    for line, a in zip(items, comparison.do_first_head, strict=True):
        assert line.startswith(f"{line[0]}. **{a.action}**")
        if a.saving_ms is not None:
            assert f"Saves ~{a.saving_ms:.2f} ms per iteration ({a.saving_basis})." in line
        assert line.endswith(f"Evidence: {a.evidence}")
    # a head without a summary (a report stored before it existed) renders no block
    bare = comparison.model_copy(update={"do_first_head": []})
    assert "Do this first" not in render_comment(bare, context)
