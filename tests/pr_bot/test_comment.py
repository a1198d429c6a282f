"""PR-comment markdown: content, escaping, marker and the 65,536-character cap."""

from __future__ import annotations

import pytest
import web_factories as f

from analyzers.report import HelperDelta
from pr_bot.comment import (
    MAX_COMMENT_CHARS,
    CommentContext,
    CommentError,
    cap_length,
    md_code,
    md_text,
    render_comment,
    suite_marker,
)

CTX = CommentContext(
    suite="ref-2xh200",
    base_name="run 1",
    head_name="run 2",
    comparison_url="http://cptrace.test/compare/1/2",
)


def test_comment_has_marker_verdict_table_helpers_findings_and_link() -> None:
    body = render_comment(f.comparison_report(), CTX)
    lines = body.splitlines()
    assert lines[0] == "<!-- cptrace:suite=ref-2xh200 -->"
    assert lines[1] == "### cptrace · ref-2xh200: :rocket: faster"
    assert "| metric | base | head | delta | significance |" in body
    median_row = next(line for line in lines if line.startswith("| iteration time, median"))
    assert "| 21." in median_row and "| -2." in median_row and "**significant**" in median_row
    assert "p=1.2e-09" in median_row and "95% CI" in median_row
    assert "| launches per step | 72.0 | 16.0 | -56.0 (-77.8%) | exact: CPU launch calls" in body
    assert "| `get_cu_seqlens_on_cp_rank` | metadata | 32.0 | 0.0 | -32.0 | -0.128 |" in body
    assert "`attn_fwd_step`" not in body  # unchanged helpers are left out
    assert "resolved: ~~Padded THD path taken without padding~~" in body
    assert body.rstrip().endswith("[Full comparison](http://cptrace.test/compare/1/2)")


def test_template_names_and_free_text_cannot_inject_html_or_break_tables() -> None:
    report = f.comparison_report(slower=True)
    report.findings_head = [f.finding()]
    report.helpers.append(
        HelperDelta(
            helper="lambda|<int>",
            category="other",
            base_launches=0,
            head_launches=3,
            delta_launches=3,
            base_gpu_time_ns=0,
            head_gpu_time_ns=10,
            delta_gpu_time_ns=10,
            status="appeared",
        )
    )
    body = render_comment(report, CTX)
    assert ":warning: slower" in body
    assert "`zero_fill<dQ>`" in body  # inside a code span GitHub shows it literally
    assert "`lambda\\|<int>`" in body
    assert "&lt;fast path&gt;" in body and "<fast path>" not in body
    assert "new: **Padded THD path" not in body  # it was in base too
    assert "Expected saving: about 2.69 ms per iteration (12.6%)" in body
    assert md_text("a|b<c>\nd") == "a\\|b&lt;c&gt; d"
    assert md_code("x`y") == "`x'y`"


def test_no_iterations_and_no_changes_still_render() -> None:
    report = f.comparison_report()
    report.iterations = None
    report.helpers = [h for h in report.helpers if h.status == "unchanged"]
    report.findings_base = []
    body = render_comment(report, CommentContext())
    assert "iteration time" not in body
    assert "No helper changed" in body and "No findings on either run." in body
    assert "[Full comparison]" not in body


@pytest.mark.parametrize("suite", ["", "a b", "x-->", "<script>", "a" * 101])
def test_unusable_suite_names_are_refused(suite: str) -> None:
    with pytest.raises(CommentError, match="suite name"):
        suite_marker(suite)


def test_long_bodies_are_cut_at_a_line_with_a_visible_notice() -> None:
    report = f.comparison_report()
    report.helpers = [
        HelperDelta(
            helper=f"helper_{i}<{'T' * 200}>",
            category="other",
            base_launches=i,
            head_launches=i + 1,
            delta_launches=1,
            base_gpu_time_ns=0,
            head_gpu_time_ns=1,
            delta_gpu_time_ns=1,
            status="changed",
        )
        for i in range(2000)
    ]
    body = render_comment(report, CTX, helper_limit=2000)
    assert len(body) <= MAX_COMMENT_CHARS
    assert body.startswith("<!-- cptrace:suite=ref-2xh200 -->\n")
    assert "**Truncated**" in body and "http://cptrace.test/compare/1/2" in body.splitlines()[-1]
    kept = body.split("\n\n> :scissors:")[0]
    assert kept.endswith("|")  # whole table rows only
    short = "line\n" * 10
    assert cap_length(short, limit=100) == short
    cut = cap_length("x" * 500, limit=200)  # no newline to cut at: hard cut, still within limit
    assert len(cut) <= 200 and "Truncated" in cut
