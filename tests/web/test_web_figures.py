"""Figure builders: assert on the figure dicts, and let plotly validate every property."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
import web_factories as f
from testkit import DATA_DIR

from analyzers.report import HelperDelta, Timeline
from web import figures


def _valid(fig: dict) -> dict:
    """The plain plotly figure (strings put back, as the page script does), validated."""
    plain = figures.expand_figure(fig)
    go.Figure(plain)  # raises ValueError on any unknown or mistyped property
    return plain


def test_iteration_distribution_groups_by_variant_with_one_trace_per_rank() -> None:
    report = f.analysis_report()
    fig = _valid(figures.iteration_distribution(report.iterations))
    assert [t["name"] for t in fig["data"]] == ["rank 0", "rank 1"]
    rank0 = fig["data"][0]
    assert set(rank0["x"]) == {"auto_clone", "explicit_false"}
    assert len(rank0["y"]) == 40  # every sample of both variants is drawn
    assert fig["layout"]["boxmode"] == "group"


def test_helper_bars_stack_per_step_values_and_escape_template_names() -> None:
    fig = _valid(figures.helper_bars(f.helper_stats(), "launches"))
    assert fig["layout"]["barmode"] == "stack"
    by_name = {t["name"]: t for t in fig["data"]}
    assert "zero_fill&lt;dQ&gt;" in by_name and "zero_fill<dQ>" not in by_name
    cu = by_name["get_cu_seqlens_on_cp_rank"]
    columns = cu["x"]
    assert columns == [
        "arm:auto_clone · r0",
        "arm:auto_clone · r1",
        "arm:explicit_false · r0",
        "arm:explicit_false · r1",
    ]
    assert cu["y"] == [16.0, 16.0, 0.0, 0.0]  # 48 launches over 3 steps
    assert cu["legendgroup"] == "metadata"
    time_fig = _valid(figures.helper_bars(f.helper_stats(), "gpu_time_ms"))
    attn = next(t for t in time_fig["data"] if t["name"] == "attn_fwd_step")
    assert attn["y"] == pytest.approx([8.0, 8.0, 8.0, 8.0])


def test_category_bars_sum_helpers_of_a_category() -> None:
    fig = _valid(figures.category_bars(f.helper_stats(), "launches"))
    by_name = {t["name"]: t["y"] for t in fig["data"]}
    assert by_name["zero-fill"] == [12.0, 12.0, 0.0, 0.0]
    assert by_name["attention compute"] == [8.0, 8.0, 8.0, 8.0]


def test_helper_colour_is_stable_and_shared_between_figures() -> None:
    assert figures.helper_color("attn_fwd_step") == figures.helper_color("attn_fwd_step")
    bars = figures.helper_bars(f.helper_stats(), "launches")
    timeline = figures.timeline_figure(f.timeline())
    colour = {t["name"]: t["marker"]["color"] for t in bars["data"]}
    for trace in timeline["data"]:
        assert trace["marker"]["color"] == colour[trace["name"]]


def test_timeline_bars_start_at_event_start_in_ms_one_row_per_rank_and_stream() -> None:
    fig = _valid(figures.timeline_figure(f.timeline()))
    names = sorted(t["name"] for t in fig["data"])
    assert names == ["attn_fwd_step", "zero_fill&lt;dQ&gt;"]
    zero = next(t for t in fig["data"] if t["name"].startswith("zero"))
    assert zero["base"][0] == 0.0 and zero["x"][0] == pytest.approx(0.005)
    assert set(zero["y"]) == {"rank 0 · stream 7", "rank 1 · stream 7"}
    assert all("&lt;" in text and "<" not in text for text in zero["hovertext"])
    assert sum(len(t["x"]) for t in fig["data"]) == 80


def test_timeline_decimation_keeps_the_longest_events_per_rank() -> None:
    tl = f.timeline()
    fig = _valid(figures.timeline_figure(tl, max_events=5))
    durations = sorted((x for t in fig["data"] for x in t["x"]), reverse=True)
    assert len(durations) == 10  # 5 per rank
    assert durations[0] == pytest.approx((5000 + 39 * 10) / 1e6)
    assert "70 shortest events not drawn" in fig["layout"]["title"]["text"]
    empty = _valid(figures.timeline_figure(Timeline(window="w", limit=1, dropped=0, events=[])))
    assert empty["data"] == []


def test_comparison_distributions_overlay_base_and_head_with_median_lines() -> None:
    cmp = f.comparison_report().iterations
    assert cmp is not None
    fig = _valid(figures.comparison_distributions(cmp))
    assert [t["name"] for t in fig["data"]] == ["base: auto_clone", "head: explicit_false"]
    assert fig["data"][0]["x"] == cmp.base.samples_ms
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [cmp.base.median_ms, cmp.head.median_ms]
    assert fig["layout"]["barmode"] == "overlay"


def test_helper_delta_bars_leave_out_unchanged_and_put_the_largest_on_top() -> None:
    fig = _valid(figures.helper_delta_bars(f.comparison_report().helpers))
    launches, time = fig["data"]
    assert launches["y"] == ["get_cu_seqlens_on_cp_rank", "zero_fill&lt;dQ&gt;"]
    assert launches["x"] == [-32.0, -24.0]
    assert time["x"] == pytest.approx([-0.128, -0.216])
    assert time["xaxis"] == "x2"


def test_helper_delta_bars_limit() -> None:
    deltas = [
        HelperDelta(
            helper=f"h{i}",
            category="other",
            base_launches=0,
            head_launches=i,
            delta_launches=i,
            base_gpu_time_ns=0,
            head_gpu_time_ns=i * 1000,
            delta_gpu_time_ns=i * 1000,
            status="appeared",
        )
        for i in range(1, 41)
    ]
    fig = figures.helper_delta_bars(deltas, limit=10)
    assert fig["data"][0]["y"][-1] == "h40" and len(fig["data"][0]["y"]) == 10


def test_history_figure_band_and_values() -> None:
    pts = [
        figures.SeriesPoint(x="abc1234", value=21.3, low=21.0, high=21.6, link="/runs/1"),
        figures.SeriesPoint(x="def5678", value=18.6, low=18.4, high=18.9, link="/runs/2"),
        figures.SeriesPoint(x="0badc0de", value=18.7),  # no band known for this one
    ]
    fig = _valid(figures.history_figure(pts, "iteration median", "ms"))
    band, line = fig["data"]
    assert band["fill"] == "toself"
    assert band["y"] == [21.6, 18.9, 18.4, 21.0]
    assert line["y"] == [21.3, 18.6, 18.7]
    assert line["customdata"] == ["/runs/1", "/runs/2", None]
    assert line["x"][0] == "1: abc1234"
    assert len(figures.history_figure([], "m")["data"]) == 1


# ---- the GPU timeline, the per-kernel table and kernel deltas on a real report ---------------


@pytest.fixture(scope="module")
def real_report():

    from analyzers.pipeline import analyze

    data = DATA_DIR / "te-2.20.2-h200x2"
    files = [data / "kineto_3arms_rank0.json.gz", data / "kineto_3arms_rank1.json.gz"]
    return analyze(files, step_pattern="^arm:")


def test_timeline_breakdown_stacks_to_the_window_per_step(real_report) -> None:
    fig = _valid(figures.run_timeline_breakdown(real_report.gpu_timeline))
    assert fig["layout"]["barmode"] == "stack"
    assert [t["name"] for t in fig["data"]] == [
        "computation",
        "exposed communication",
        "exposed memcpy",
        "idle",
    ]
    steps = [t for t in real_report.gpu_timeline if t.window != "whole trace"]
    assert fig["data"][0]["x"] == [f"{t.window} · r{t.rank}" for t in steps]
    for i, t in enumerate(steps):
        stacked = sum(trace["y"][i] for trace in fig["data"])
        assert stacked == pytest.approx(t.total_ns / t.steps / 1e6)
    assert fig["layout"]["yaxis"]["title"]["text"] == "ms per step"


def test_whole_trace_breakdown_is_labelled_as_totals(real_report) -> None:
    whole = [t for t in real_report.gpu_timeline if t.window == "whole trace"]
    fig = _valid(figures.run_timeline_breakdown(whole))
    assert fig["layout"]["yaxis"]["title"]["text"] == "whole trace (ms)"
    assert fig["data"][3]["y"][0] == pytest.approx(whole[0].idle_ns / 1e6)


def test_comparison_breakdown_puts_base_and_head_side_by_side(real_report) -> None:
    from analyzers.compare import compare_reports

    result = compare_reports(
        real_report, real_report, base_window="arm:auto_clone", head_window="arm:auto_same"
    )
    fig = _valid(figures.comparison_timeline_breakdown(result.timeline_base, result.timeline_head))
    assert fig["data"][0]["x"] == ["base · r0", "head · r0", "base · r1", "head · r1"]


def test_run_and_compare_pages_show_the_new_figures(real_report) -> None:
    from fastapi.testclient import TestClient
    from web_fake_store import demo_store, make_app

    from analyzers.compare import compare_reports

    store = demo_store()
    store.reports[1] = store.reports[2] = real_report
    store.comparison = compare_reports(
        real_report, real_report, base_window="arm:auto_clone", head_window="arm:explicit_false"
    )
    client = TestClient(make_app(store))
    page = client.get("/runs/1")
    assert page.status_code == 200
    html = page.text
    for anchor in ('id="gpu-timeline-table"', 'id="devices-table"', 'id="kernels-table"'):
        assert anchor in html
    assert 'class="kernels sortable"' in html and 'data-sort="num"' in html
    assert "fig-gpu_timeline" in html
    top = max(
        (k for k in real_report.kernels if k.window == "whole trace" and k.rank is None),
        key=lambda k: k.total_ns,
    )
    assert f'data-value="{top.total_ns}"' in html
    twin = client.get("/runs/1.json").json()
    assert twin["figures"]["gpu_timeline"]["layout"]["barmode"] == "stack"
    compare = client.get("/compare/1/2?base_window=arm:auto_clone&head_window=arm:explicit_false")
    assert compare.status_code == 200
    text = compare.text
    for anchor in ('id="kernel-deltas-table"', 'id="total-gpu-table"', 'id="rank-deltas-table"'):
        assert anchor in text
    assert "Head (arm:explicit_false)" in text and "Base (arm:auto_clone)" in text
    assert "fig-gpu_timeline" in text
