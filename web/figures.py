"""Pure plotly figure builders: report models in, plotly figure dicts out.

Plotting stays out of ``analyzers/`` (the HTA lesson in STYLE.md): these functions take the
report models the analyzers produce and return plain ``{"data": [...], "layout": {...}}`` dicts
that plotly.js renders in the browser and tests assert on. They import nothing from plotly, so
building a page costs no plotly import; tests validate the dicts with ``plotly.graph_objects``.

Every text that ends up inside an SVG label (helper and kernel names, which contain C++ template
brackets such as ``at::native::vectorized_elementwise_kernel<4, ...>``) goes through
:func:`svg_text`, because plotly interprets a small HTML subset in labels and hover text.

A figure with thousands of bars (the step timeline) sends each distinct string once: the
figure's ``strings`` list, and per trace ``indexed``, the fields whose values are indexes into
it; a field that repeats another field of its trace is sent once too (``copies``: field ->
the field it repeats). :func:`expand_figure` (and ``expandFigure`` in ``static/cptrace.js``,
before plotly draws) puts them back, so plotly gets exactly the figure it would have got with
every value written out.
"""

from __future__ import annotations

import hashlib
import html
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson

from analyzers.report import (
    AccountDelta,
    AccountPartKind,
    Category,
    GroupAccount,
    GroupTimeline,
    HelperDelta,
    HelperStat,
    IterationComparison,
    IterationStats,
    Timeline,
    TimelineGap,
)
from service.page_summary import TimelineColumns, timeline_columns

Figure = dict[str, Any]

NS_PER_MS = 1e6

# Okabe-Ito plus tab10 extras: distinguishable, and stable because colours are picked by a hash
# of the helper name, so one helper has one colour on every page and every run.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
    "#8C564B", "#7F7F7F", "#BCBD22", "#17BECF", "#9467BD", "#1F77B4", "#2CA02C",
)  # fmt: skip
CATEGORY_COLORS: dict[str, str] = {
    Category.METADATA.value: "#D55E00",
    Category.ZERO_FILL.value: "#E69F00",
    Category.PARTITION.value: "#CC79A7",
    Category.ATTENTION.value: "#0072B2",
    Category.COMMUNICATION.value: "#009E73",
    Category.HOST_SYNC.value: "#F0E442",
    Category.OTHER.value: "#7F7F7F",
}
BASE_COLOR = "#7F7F7F"
HEAD_COLOR = "#0072B2"
_LAYOUT_DEFAULTS: dict[str, Any] = {
    "template": None,
    "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "legend": {"orientation": "v"},
}


def svg_text(text: str) -> str:
    """Escape ``text`` for plotly labels, which parse a small HTML subset (``<b>``, ``<br>``).

    plotly decodes the entities back, so ``foo<int>`` shows as typed instead of vanishing as an
    unknown tag.
    """
    return html.escape(text, quote=False)


_HTML_SAFE = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027"))


def html_json(value: Any) -> str:
    """``value`` as JSON that is safe inside an HTML ``<script>`` block: Jinja's ``tojson``
    (sorted keys; ``<``, ``>``, ``&`` and ``'`` as ``\\u`` escapes), written by orjson."""
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    for char, code in _HTML_SAFE:
        if char in text:
            text = text.replace(char, code)
    return text


class StringTable:
    """The distinct strings of one figure, in first-use order: a field that would repeat a
    name per bar holds its index here instead (``indexed``)."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.strings)
            self.strings.append(text)
        return found

    def indexes(self, codes: np.ndarray, text: Callable[[int], str]) -> list[int]:
        """The table index of ``text(code)`` for each of ``codes`` (integers), ``text``
        called once per distinct code."""
        if not len(codes):
            return []
        distinct, inverse = np.unique(codes, return_inverse=True)
        found = np.asarray([self.add(text(int(c))) for c in distinct], dtype=np.int64)
        return found[inverse.reshape(-1)].tolist()  # type: ignore[no-any-return]


def expand_figure(fig: Figure) -> Figure:
    """``fig`` with every ``indexed`` field's indexes replaced by the figure's ``strings`` and
    every ``copies`` field filled in (the plain plotly figure, as ``static/cptrace.js`` hands
    it to plotly); a figure without a string table is returned as it is. ``fig`` is not
    changed."""
    strings = fig.get("strings")
    if strings is None:
        return fig
    data = []
    for trace in fig["data"]:
        plain = {k: v for k, v in trace.items() if k not in ("indexed", "copies")}
        for field in trace.get("indexed", ()):
            plain[field] = [strings[i] for i in trace[field]]
        for field, source in trace.get("copies", {}).items():
            plain[field] = list(plain[source])
        data.append(plain)
    return {**{k: v for k, v in fig.items() if k != "strings"}, "data": data}


def helper_color(helper: str) -> str:
    """A stable colour for a helper name (same on every page, run and process)."""
    digest = hashlib.blake2s(helper.encode(), digest_size=2).digest()
    return PALETTE[int.from_bytes(digest, "big") % len(PALETTE)]


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {**_LAYOUT_DEFAULTS, "title": {"text": svg_text(title)}, **extra}


def _rank_label(rank: int | None) -> str:
    return "all ranks" if rank is None else f"rank {rank}"


def iteration_distribution(iterations: Sequence[IterationStats]) -> Figure:
    """Box plots of iteration times, grouped by variant, one colour per rank.

    Every sample is drawn (``boxpoints="all"``): the reference workload has outliers that skew
    means, and the point cloud shows them where a box alone would hide them.
    """
    by_rank: dict[int | None, list[IterationStats]] = defaultdict(list)
    for stats in iterations:
        by_rank[stats.rank].append(stats)
    data = []
    for rank in sorted(by_rank, key=lambda r: (r is None, r or 0)):
        xs: list[str] = []
        ys: list[float] = []
        for stats in by_rank[rank]:
            xs.extend([svg_text(stats.label)] * len(stats.samples_ms))
            ys.extend(stats.samples_ms)
        data.append(
            {
                "type": "box",
                "name": _rank_label(rank),
                "x": xs,
                "y": ys,
                "boxpoints": "all",
                "jitter": 0.4,
                "pointpos": 0,
                "marker": {"size": 4},
            }
        )
    layout = _layout(
        "Iteration time per variant and rank",
        boxmode="group",
        yaxis={"title": {"text": "iteration time (ms)"}},
        xaxis={"title": {"text": "variant"}},
    )
    return {"data": data, "layout": layout}


HelperMetric = Literal["launches", "gpu_time_ms"]


def _helper_value(stat: HelperStat, metric: HelperMetric) -> float:
    steps = max(stat.steps, 1)
    if metric == "launches":
        return stat.launches / steps
    return stat.gpu_time_ns / steps / NS_PER_MS


def helper_bars(helpers: Sequence[HelperStat], metric: HelperMetric) -> Figure:
    """Stacked bars per window and rank: one segment per helper, legend grouped by category.

    Values are per step (``steps`` windows were summed), so windows with different step counts
    compare directly.
    """
    columns = sorted({(s.window, s.rank) for s in helpers})
    xlabels = [f"{svg_text(w)} · r{r}" for w, r in columns]
    index = {col: i for i, col in enumerate(columns)}
    per_helper: dict[tuple[str, str], list[float]] = {}
    for stat in helpers:
        key = (stat.category.value, stat.helper)
        values = per_helper.setdefault(key, [0.0] * len(columns))
        values[index[(stat.window, stat.rank)]] += _helper_value(stat, metric)
    unit = "launches per step" if metric == "launches" else "GPU time per step (ms)"
    data = []
    for category, helper in sorted(per_helper):
        name = svg_text(helper)
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": xlabels,
                "y": per_helper[(category, helper)],
                "legendgroup": category,
                "legendgrouptitle": {"text": svg_text(category)},
                "marker": {"color": helper_color(helper)},
                "hovertemplate": f"{name}<br>%{{x}}: %{{y:.3f}}<extra>{svg_text(category)}</extra>",
            }
        )
    title = "Launches per helper" if metric == "launches" else "GPU time per helper"
    layout = _layout(
        title,
        barmode="stack",
        yaxis={"title": {"text": unit}},
        xaxis={"title": {"text": "window · rank"}, "type": "category", "automargin": True},
        legend={"groupclick": "toggleitem"},
    )
    return {"data": data, "layout": layout}


def category_bars(helpers: Sequence[HelperStat], metric: HelperMetric) -> Figure:
    """Stacked bars per window and rank with one segment per helper category."""
    columns = sorted({(s.window, s.rank) for s in helpers})
    index = {col: i for i, col in enumerate(columns)}
    per_category: dict[str, list[float]] = {}
    for stat in helpers:
        values = per_category.setdefault(stat.category.value, [0.0] * len(columns))
        values[index[(stat.window, stat.rank)]] += _helper_value(stat, metric)
    data = [
        {
            "type": "bar",
            "name": svg_text(category),
            "x": [f"{svg_text(w)} · r{r}" for w, r in columns],
            "y": values,
            "marker": {"color": CATEGORY_COLORS.get(category, BASE_COLOR)},
        }
        for category, values in sorted(per_category.items())
    ]
    unit = "launches per step" if metric == "launches" else "GPU time per step (ms)"
    layout = _layout(
        "Launches per category" if metric == "launches" else "GPU time per category",
        barmode="stack",
        yaxis={"title": {"text": unit}},
        xaxis={"title": {"text": "window · rank"}, "type": "category", "automargin": True},
    )
    return {"data": data, "layout": layout}


def _as_columns(timeline: Timeline | TimelineColumns) -> TimelineColumns:
    return timeline if isinstance(timeline, TimelineColumns) else timeline_columns(timeline)


def decimate_events(timeline: TimelineColumns, max_events: int) -> tuple[np.ndarray, int]:
    """The indices of the ``max_events`` longest events per rank (the analyzer already
    decimates; this bounds what a browser must draw even for reports produced with a larger
    limit), in (rank, stream, start) order, and how many were left out."""
    rank = np.asarray(timeline.rank, dtype=np.int64)
    duration = np.asarray(timeline.end_ns, dtype=np.int64) - np.asarray(
        timeline.start_ns, dtype=np.int64
    )
    kept: list[np.ndarray] = []
    dropped = 0
    for r in dict.fromkeys(timeline.rank):  # ranks in order of appearance
        mine = np.flatnonzero(rank == r)
        longest = mine[np.argsort(-duration[mine], kind="stable")]
        kept.append(longest[:max_events])
        dropped += max(0, len(mine) - max_events)
    order = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    stream, start = np.asarray(timeline.stream), np.asarray(timeline.start_ns)
    if len(order):
        order = order[np.lexsort((start[order], stream[order], rank[order]))]
    return order, dropped


def _ms(ns: np.ndarray) -> list[float]:
    """Integer ns as ms: an int below 2^53 divided by 1e6 is the float nearest to its 6-decimal
    value, which prints with those digits and none more."""
    return (ns.astype(np.float64) / NS_PER_MS).tolist()  # type: ignore[no-any-return]


def timeline_figure(timeline: Timeline | TimelineColumns, max_events: int = 3000) -> Figure:
    """Horizontal bars on one row per rank and stream, one trace (colour) per helper, and above
    each rank's streams a row of its idle gaps, coloured by cause and labelled with the cause
    and helper ("idle: host-bound: get_cu_seqlens_on_cp_rank 1.200 ms"; outline in the helper's
    colour).

    Bars are ``base=start, x=duration`` in milliseconds from the window start, which renders
    thousands of kernels in one SVG trace per helper instead of one shape per kernel. Built
    column-wise (``TimelineColumns``: the page summary stores the timeline that way).
    """
    cols = _as_columns(timeline)
    kept, extra_dropped = decimate_events(cols, max_events)
    rank = np.asarray(cols.rank, dtype=np.int64)[kept]
    stream = np.asarray(cols.stream, dtype=np.int64)[kept]
    start = np.asarray(cols.start_ns, dtype=np.int64)[kept]
    width = np.maximum(np.asarray(cols.end_ns, dtype=np.int64)[kept] - start, 1)
    helper = np.asarray(cols.helper, dtype=np.int64)[kept]
    rows = sorted(set(zip(rank.tolist(), stream.tolist(), strict=True)))
    row_label = {row: f"rank {row[0]} · stream {row[1]}" for row in rows}
    table = StringTable()
    row_code = np.searchsorted(
        np.asarray([r * (1 << 32) + s for r, s in rows], dtype=np.int64),
        rank * (1 << 32) + stream,
    )  # the index in ``rows`` of each bar's (rank, stream)
    names = np.asarray(cols.name, dtype=np.int64)[kept]
    data = []
    for index in sorted(set(helper.tolist()), key=lambda i: cols.strings[i]):
        mask = helper == index
        name = svg_text(cols.strings[index])
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "base": _ms(start[mask]),
                "x": _ms(width[mask]),
                "y": table.indexes(row_code[mask], lambda i: row_label[rows[i]]),
                # each drawn name escaped once
                "hovertext": table.indexes(names[mask], lambda i: svg_text(cols.strings[i])),
                "indexed": ["y", "hovertext"],
                # a bar with a base hovers %{x} as its end: the duration comes as customdata
                "copies": {"customdata": "x"},
                "hovertemplate": (
                    f"<b>{name}</b><br>%{{hovertext}}<br>start %{{base:.3f}} ms, "
                    "%{customdata:.4f} ms<extra></extra>"
                ),
                "marker": {"color": helper_color(cols.strings[index]), "line": {"width": 0}},
            }
        )
    data += idle_gap_traces(cols, table)
    gap_ranks = sorted(set(cols.gap_rank))
    order: list[str] = []
    for r in sorted({r for r, _ in rows} | set(gap_ranks)):
        if r in gap_ranks:
            order.append(gap_row(r))
        order += [row_label[row] for row in rows if row[0] == r]
    dropped = cols.dropped + extra_dropped
    subtitle = f" ({dropped} shortest events not drawn)" if dropped else ""
    if cols.gaps_dropped:
        subtitle += f" ({cols.gaps_dropped} shortest idle gaps not drawn)"
    layout = _layout(
        f"Timeline of {cols.window}{subtitle}",
        barmode="overlay",
        bargap=0.3,
        xaxis={"title": {"text": "time from window start (ms)"}},
        yaxis={
            "type": "category",
            "automargin": True,
            "categoryorder": "array",
            "categoryarray": list(reversed(order)),
        },
        uniformtext={"mode": "hide", "minsize": 8},
        annotations=gap_annotations(cols),
        height=max(260, 90 * len(order) + 120),
    )
    return {"data": data, "layout": layout, "strings": table.strings}


def longest_gap(timeline: TimelineColumns, keep: np.ndarray) -> TimelineGap | None:
    """The longest of the gaps where ``keep`` is true (the first of equals), or None."""
    found = np.flatnonzero(keep)
    if not len(found):
        return None
    duration = np.asarray(timeline.gap_end_ns, dtype=np.int64)[found] - np.asarray(
        timeline.gap_start_ns, dtype=np.int64
    )[found]
    i = int(found[int(np.argmax(duration))])
    s = timeline.strings
    return TimelineGap(
        rank=timeline.gap_rank[i],
        start_ns=timeline.gap_start_ns[i],
        end_ns=timeline.gap_end_ns[i],
        part=AccountPartKind(s[timeline.gap_part[i]]),
        label=s[timeline.gap_label[i]],
    )


def gap_annotations(timeline: TimelineColumns, per_rank: int = 1) -> list[dict[str, Any]]:
    """The label of each rank's longest idle gap, readable before any zoom (a bar's own text
    shows only where it fits; more labels would overlap at full width)."""
    out = []
    ranks = np.asarray(timeline.gap_rank, dtype=np.int64)
    for rank in sorted(set(timeline.gap_rank)):
        g = longest_gap(timeline, ranks == rank)
        for gap in [g][:per_rank] if g else []:
            out.append(
                {
                    "x": (gap.start_ns + gap.end_ns) / 2 / NS_PER_MS,
                    "y": gap_row(rank),
                    "text": svg_text(gap_text(gap)),
                    "showarrow": True,
                    "arrowhead": 0,
                    "ax": 0,
                    "ay": -26,
                    "font": {"size": 10},
                    "bgcolor": "rgba(255,255,255,0.85)",
                }
            )
    return out


def gap_row(rank: int) -> str:
    """The timeline row of a rank's idle gaps (also what an idle-cause link zooms to)."""
    return f"rank {rank} · idle gaps"


def gap_text(gap: TimelineGap) -> str:
    """How a drawn gap is labelled: cause, helper (what it is attributed to), duration."""
    return f"{gap.part.value}: {gap.label} {(gap.end_ns - gap.start_ns) / NS_PER_MS:.3f} ms"


def idle_gap_traces(
    timeline: Timeline | TimelineColumns, table: StringTable
) -> list[dict[str, Any]]:
    """One bar trace per idle cause (account part) on the ranks' idle-gap rows: the full label
    ("idle: host-bound: get_cu_seqlens_on_cp_rank 1.200 ms") in the hover, helper and duration
    as the bar's text. Rows and labels are indexes into the figure's ``table``; plotly writes
    the duration, the bar's width with 3 decimals (the same digits as :func:`gap_text`)."""
    cols = _as_columns(timeline)
    s = cols.strings
    part_of = np.asarray(cols.gap_part, dtype=np.int64)
    start = np.asarray(cols.gap_start_ns, dtype=np.int64)
    end = np.asarray(cols.gap_end_ns, dtype=np.int64)
    label_of = np.asarray(cols.gap_label, dtype=np.int64)
    rank_of = np.asarray(cols.gap_rank, dtype=np.int64)
    used = set(cols.gap_label)
    # escaping is per character: each label is escaped once, the numbers need none
    escaped = {i: svg_text(s[i]) for i in used}
    colors = {i: helper_color(s[i]) for i in used}
    out = []
    for part, color in ACCOUNT_COLORS.items():
        if part not in s:
            continue
        mask = part_of == s.index(part)
        if not mask.any():
            continue
        labels = label_of[mask].tolist()
        cause = svg_text(part)
        hover = {i: f"{cause}: {escaped[i]}" for i in set(labels)}
        out.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": part,
                "legendgroup": "idle gaps",
                "base": _ms(start[mask]),
                "x": _ms(np.maximum(end[mask] - start[mask], 1)),
                "y": table.indexes(rank_of[mask], gap_row),
                # on the bar (where it fits): helper and duration; the colour and hover give
                # the cause; = svg_text(gap_text(gap)) in the hover
                "text": table.indexes(label_of[mask], escaped.__getitem__),
                "texttemplate": "%{text} %{x:.3f} ms",
                "textposition": "inside",
                "insidetextanchor": "start",
                "hovertext": table.indexes(label_of[mask], hover.__getitem__),
                "indexed": ["y", "text", "hovertext"],
                "copies": {"customdata": "x"},  # the hover's %{x} would be the bar's end
                "hovertemplate": (
                    "<b>%{hovertext} %{customdata:.3f} ms</b><br>start %{base:.3f} ms"
                    "<extra></extra>"
                ),
                "marker": {
                    "color": color,
                    "line": {"color": [colors[i] for i in labels], "width": 1.5},
                },
            }
        )
    return out


def comparison_distributions(comparison: IterationComparison) -> Figure:
    """Overlaid histograms of base and head iteration times with their medians marked."""
    data = []
    shapes = []
    for stats, color, role in (
        (comparison.base, BASE_COLOR, "base"),
        (comparison.head, HEAD_COLOR, "head"),
    ):
        data.append(
            {
                "type": "histogram",
                "name": f"{role}: {svg_text(stats.label)}",
                "x": stats.samples_ms,
                "opacity": 0.6,
                "marker": {"color": color},
                "nbinsx": 30,
            }
        )
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": stats.median_ms,
                "x1": stats.median_ms,
                "y0": 0,
                "y1": 1,
                "line": {"color": color, "dash": "dash", "width": 2},
            }
        )
    layout = _layout(
        "Iteration time: base vs head (dashed: medians)",
        barmode="overlay",
        xaxis={"title": {"text": "iteration time (ms)"}},
        yaxis={"title": {"text": "iterations"}},
        shapes=shapes,
    )
    return {"data": data, "layout": layout}


def helper_delta_bars(deltas: Sequence[HelperDelta], limit: int = 25) -> Figure:
    """Per-helper launch and GPU-time deltas (head - base, per step) side by side.

    Unchanged helpers are left out; the ``limit`` largest changes by GPU time are kept so a
    report with hundreds of helpers still reads.
    """
    changed = [d for d in deltas if d.status != "unchanged"]
    changed.sort(key=lambda d: (abs(d.delta_gpu_time_ns), abs(d.delta_launches)), reverse=True)
    changed = changed[:limit][::-1]  # largest at the top of a horizontal bar chart
    names = [svg_text(d.helper) for d in changed]
    colors = [CATEGORY_COLORS.get(d.category.value, BASE_COLOR) for d in changed]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": "Δ launches per step",
            "y": names,
            "x": [d.delta_launches for d in changed],
            "marker": {"color": colors},
            "xaxis": "x",
            "yaxis": "y",
        },
        {
            "type": "bar",
            "orientation": "h",
            "name": "Δ GPU time per step (ms)",
            "y": names,
            "x": [d.delta_gpu_time_ns / NS_PER_MS for d in changed],
            "marker": {"color": colors},
            "xaxis": "x2",
            "yaxis": "y2",
        },
    ]
    layout = _layout(
        "Per-helper change (head - base)",
        showlegend=False,
        grid={"rows": 1, "columns": 2, "pattern": "independent"},
        xaxis={"title": {"text": "Δ launches per step"}, "zeroline": True},
        xaxis2={"title": {"text": "Δ GPU time per step (ms)"}, "zeroline": True},
        yaxis={"automargin": True, "type": "category"},
        yaxis2={"showticklabels": False, "type": "category", "matches": "y"},
        height=max(300, 28 * len(changed) + 140),
    )
    return {"data": data, "layout": layout}


TIMELINE_PARTS = (
    ("computation_ns", "computation", "#0072B2"),
    ("exposed_communication_ns", "exposed communication", "#009E73"),
    ("exposed_memcpy_ns", "exposed memcpy", "#E69F00"),
    ("idle_ns", "idle", "#D9D9D9"),
)
"""The stacked parts of a window's GPU timeline: they add up to the window length."""


def timeline_breakdown(columns: Sequence[tuple[str, GroupTimeline]], title: str) -> Figure:
    """Stacked bars of the clipped GPU timeline, one bar per (label, rank timeline): computation
    + exposed communication + exposed memcpy (= busy) + idle = the window.

    Step groups are per step (sums / steps); a whole-trace group is its total, and the axis
    title says which.
    """
    labels = [svg_text(label) for label, _ in columns]
    whole = bool(columns) and all(t.window == "whole trace" for _, t in columns)
    per = "whole trace (ms)" if whole else "ms per step"

    def value(t: GroupTimeline, part: str) -> float:
        steps = 1 if t.window == "whole trace" else max(t.steps, 1)
        return float(getattr(t, part)) / steps / NS_PER_MS

    data = [
        {
            "type": "bar",
            "name": name,
            "x": labels,
            "y": [value(t, part) for _, t in columns],
            "marker": {"color": color},
            "hovertemplate": f"%{{x}}<br>{name}: %{{y:.3f}} ms<extra></extra>",
        }
        for part, name, color in TIMELINE_PARTS
    ]
    layout = _layout(
        title,
        barmode="stack",
        yaxis={"title": {"text": per}},
        xaxis={"type": "category", "automargin": True},
    )
    return {"data": data, "layout": layout}


def run_timeline_breakdown(timelines: Sequence[GroupTimeline]) -> Figure:
    """A run's step groups (the whole trace only when there is no step group), rank by rank."""
    steps = [t for t in timelines if t.window != "whole trace"] or list(timelines)
    columns = [(f"{t.window} · r{t.rank}", t) for t in steps]
    return timeline_breakdown(columns, "GPU timeline per rank, clipped to the windows")


def comparison_timeline_breakdown(
    base: Sequence[GroupTimeline], head: Sequence[GroupTimeline]
) -> Figure:
    """Base and head side by side for each rank."""
    ranks = sorted({t.rank for t in (*base, *head)})
    columns = []
    for rank in ranks:
        columns += [(f"base · r{rank}", t) for t in base if t.rank == rank]
        columns += [(f"head · r{rank}", t) for t in head if t.rank == rank]
    return timeline_breakdown(columns, "GPU timeline per rank: base vs head")


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One point of a metric history: where it sits on the x axis, its value and noise band."""

    x: str  # label on the axis (short commit, or run name)
    value: float
    low: float | None = None  # lower edge of the noise band (e.g. p10), None when unknown
    high: float | None = None
    hover: str = ""
    link: str | None = None  # page the point stands for
    spread_low: float | None = None  # the run's own spread (e.g. its p10 iteration), if known
    spread_high: float | None = None


def history_figure(points: Iterable[SeriesPoint], metric: str, unit: str = "") -> Figure:
    """A metric run by run (x: the commit, else the run's name) with its noise band (shaded
    between ``low`` and ``high``).

    Points are drawn in the order given (the store returns them oldest first), on a category
    axis so equal timestamps and re-runs of one commit stay distinct.
    """
    pts = list(points)
    xs = [f"{i + 1}: {svg_text(p.x)}" for i, p in enumerate(pts)]
    banded = [
        (x, p) for x, p in zip(xs, pts, strict=True) if p.low is not None and p.high is not None
    ]
    data: list[dict[str, Any]] = []
    if banded:
        data.append(
            {
                "type": "scatter",
                "name": "noise band",
                "x": [x for x, _ in banded] + [x for x, _ in reversed(banded)],
                "y": [p.high for _, p in banded] + [p.low for _, p in reversed(banded)],
                "fill": "toself",
                "fillcolor": "rgba(0,114,178,0.15)",
                "line": {"width": 0},
                "hoverinfo": "skip",
            }
        )
    data.append(
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": svg_text(metric),
            "x": xs,
            "y": [p.value for p in pts],
            "hovertext": [svg_text(p.hover) for p in pts],
            "customdata": [p.link for p in pts],
            "marker": {"color": HEAD_COLOR, "size": 8},
            "line": {"color": HEAD_COLOR},
        }
    )
    if any(p.spread_low is not None and p.spread_high is not None for p in pts):
        # error bars: each run's own p10-p90, next to the band of run-to-run noise
        data[-1]["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": [_gap(p.spread_high, p.value) for p in pts],
            "arrayminus": [_gap(p.value, p.spread_low) for p in pts],
            "color": HEAD_COLOR,
            "thickness": 1,
        }
    ytitle = f"{metric} ({unit})" if unit else metric
    layout = _layout(
        f"{metric} run by run",
        xaxis={
            "title": {"text": "commit, else run (oldest first)"},
            "type": "category",
            "automargin": True,
        },
        yaxis={"title": {"text": svg_text(ytitle)}, "automargin": True},
        hovermode="closest",
    )
    return {"data": data, "layout": layout}


def mark_change_points(figure: Figure, marks: Sequence[tuple[int, str]]) -> Figure:
    """Draw each change point of a :func:`history_figure` as a dashed vertical line at the
    first run of the new level, labelled with its shift (``marks``: point index, label)."""
    data = figure.get("data") or []
    series = data[-1] if data else {}
    xs = list(series.get("x") or [])
    layout = figure.setdefault("layout", {})
    shapes = list(layout.get("shapes") or [])
    notes = list(layout.get("annotations") or [])
    for index, label in marks:
        if not 0 <= index < len(xs):
            continue
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": xs[index],
                "x1": xs[index],
                "y0": 0,
                "y1": 1,
                "line": {"color": "#D55E00", "width": 2, "dash": "dash"},
            }
        )
        notes.append(
            {
                "x": xs[index],
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "showarrow": False,
                "text": svg_text(label),
                "font": {"color": "#D55E00"},
            }
        )
    layout["shapes"] = shapes
    layout["annotations"] = notes
    return figure


def _gap(high: float | None, low: float | None) -> float:
    return max(high - low, 0.0) if high is not None and low is not None else 0.0


ACCOUNT_COLORS: dict[str, str] = {
    "compute": "#0072B2",
    "exposed communication": "#009E73",
    "exposed memcpy": "#56B4E9",
    "idle: host-bound": "#D55E00",
    "idle: synchronisation": "#F0E442",
    "idle: waiting on another rank": "#CC79A7",
    "idle: other": "#BBBBBB",
}
"""One colour per step-account part (``AccountPartKind`` values), the same on every page."""


def account_bars(accounts: Sequence[GroupAccount], lines_in_hover: int = 5) -> Figure:
    """Where the step went: one stacked horizontal bar per (window group, rank), ms per step,
    one trace per account part; the hover lists each part's largest lines.

    The whole-trace group is left out when step groups exist (its bar is the whole capture,
    not a step).
    """
    rows = [a for a in accounts if a.window != "whole trace"] or list(accounts)
    rows = sorted(rows, key=lambda a: (a.window, a.rank))[::-1]  # first at the top
    y = [svg_text(f"{a.window} · rank {a.rank}") for a in rows]
    data = []
    for part, color in ACCOUNT_COLORS.items():
        x, hover = [], []
        for a in rows:
            steps = max(a.steps, 1)
            mine = sorted((p for p in a.parts if p.part.value == part), key=lambda p: -p.time_ns)
            total = sum(p.time_ns for p in mine) / steps
            x.append(total / NS_PER_MS)
            pct = 100 * total * steps / a.span_ns if a.span_ns else 0.0
            lines = [
                f"{svg_text(p.label)}: {p.time_ns / steps / NS_PER_MS:.3f} ms ({p.gaps})"
                for p in mine[:lines_in_hover]
            ]
            per = "ms/step" if a.window != "whole trace" else "ms in the whole trace"
            hover.append(
                f"<b>{svg_text(part)}</b> {total / NS_PER_MS:.3f} {per} ({pct:.1f}%)<br>"
                + "<br>".join(lines)
            )
        if any(x):
            data.append(
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": svg_text(part),
                    "y": y,
                    "x": x,
                    "marker": {"color": color},
                    "hovertext": hover,
                    "hoverinfo": "text",
                }
            )
    # only the whole trace: its bar is a total, not a step
    unit = "ms per step" if any(a.window != "whole trace" for a in rows) else "ms, whole trace"
    layout = _layout(
        f"Where the step went ({unit})",
        barmode="stack",
        xaxis={"title": {"text": unit}},
        yaxis={"automargin": True, "type": "category"},
        height=max(260, 36 * len(rows) + 140),
        legend={"orientation": "h", "y": -0.25},
    )
    return {"data": data, "layout": layout}


def account_delta_bars(deltas: Sequence[AccountDelta]) -> Figure:
    """Base and head per account part side by side (ms per step, mean over ranks)."""
    totals = [d for d in deltas if d.label == "(all)"][::-1]
    names = [svg_text(d.part.value) for d in totals]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": side,
            "y": names,
            "x": [getattr(d, f"{side}_ns") / NS_PER_MS for d in totals],
            "marker": {"color": color},
            "hovertext": [
                f"{svg_text(d.part.value)}: {d.base_ns / NS_PER_MS:.3f} -> "
                f"{d.head_ns / NS_PER_MS:.3f} ms ({d.delta_ns / NS_PER_MS:+.3f})"
                for d in totals
            ],
            "hoverinfo": "text",
        }
        for side, color in (("base", BASE_COLOR), ("head", HEAD_COLOR))
    ]
    layout = _layout(
        "Where the step went: base vs head (ms per step, mean over ranks)",
        barmode="group",
        xaxis={"title": {"text": "ms per step"}},
        yaxis={"automargin": True, "type": "category"},
        height=max(260, 44 * len(totals) + 120),
    )
    return {"data": data, "layout": layout}
