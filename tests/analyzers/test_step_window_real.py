"""The Kineto step window on every real Kineto trace, recomputed here from the plain JSON.

The rule (``docs/analyzers.md``, GPU timeline): a step paired with its ``gpu_user_annotation``
(rows of one External id merged over streams; the k-th interval of a name with the k-th CPU
range of that name) is measured from the annotation's start to ``max(annotation end,
min(last, next))``: ``last`` is the latest end of a GPU activity (kernel, memcpy, memset) whose
launch call (the runtime/driver row of the same correlation id) started inside the CPU range,
ends included; ``next`` is the start of the next window of the same (rank, group). Over that
window the busy time (union of activities clipped to it) is recomputed too, and the step
account's parts must add up to the span exactly.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from analyzers.pipeline import analyze_trace
from analyzers.readers.kineto import read_kineto
from analyzers.report import AnalysisReport, WindowBasis
from tests.analyzers.real_traces import ranked_kineto, whole_trace_report
from tests.analyzers.test_reference_figures import TRACES

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

KINETO = [p for p in TRACES if ".json" in p.name]
ACTIVITY_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def _ns(value: object) -> int:
    return int(Decimal(str(value)) * 1000)


class Raw:
    """The events the rule needs, from a plain walk of the JSON."""

    def __init__(self, path: Path) -> None:
        with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as f:
            events = json.load(f)["traceEvents"]
        launch_at: dict[int, int] = {}
        self.activities: list[tuple[int, int, int | None]] = []  # start, end, correlation
        merged: dict[tuple[str, int], list[int]] = {}
        for i, ev in enumerate(events):
            if ev.get("ph") != "X":
                continue
            cat, args = ev.get("cat"), ev.get("args") or {}
            start = _ns(ev["ts"])
            end = start + _ns(ev.get("dur", 0))
            if cat in LAUNCH_CATS and "correlation" in args:
                launch_at.setdefault(int(args["correlation"]), start)
            elif cat in ACTIVITY_CATS:
                corr = args.get("correlation")
                self.activities.append((start, end, None if corr is None else int(corr)))
            elif cat == "gpu_user_annotation":
                ext = args.get("External id")
                key = (ev["name"], int(ext) if ext is not None else -1 - i)
                lo, hi = merged.get(key, [start, end])
                merged[key] = [min(lo, start), max(hi, end)]
        self.launch_at = launch_at
        self.annotations: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for (name, _), (lo, hi) in merged.items():
            self.annotations[name].append((lo, hi))
        for intervals in self.annotations.values():
            intervals.sort()

    def launched_in(self, lo: int, hi: int) -> list[int]:
        """Ends of the activities whose launch started in ``[lo, hi]``."""
        return [
            e
            for _, e, corr in self.activities
            if corr is not None and corr in self.launch_at and lo <= self.launch_at[corr] <= hi
        ]

    def busy(self, lo: int, hi: int) -> int:
        inside = [(s, e) for s, e, _ in self.activities if s < hi and e > lo]
        pieces = sorted((max(s, lo), min(e, hi)) for s, e in inside)
        total, reach = 0, lo
        for s, e in pieces:
            if e > reach:
                total += e - max(s, reach)
                reach = e
        return total


@pytest.fixture(scope="module", params=KINETO, ids=lambda p: f"{p.parent.name}/{p.name}")
def analysed(request: pytest.FixtureRequest) -> tuple[Raw, list[AnalysisReport]]:
    path: Path = request.param
    reports = [whole_trace_report(path)]
    if "3arms" in path.name:  # the arms as steps too (the HTA comparison's windows)
        reports.append(analyze_trace(ranked_kineto(path), step_pattern="^arm:").report)
    return Raw(path), reports


def test_kineto_step_windows_follow_the_rule_exactly(
    analysed: tuple[Raw, list[AnalysisReport]],
) -> None:
    raw, reports = analysed
    for report in reports:
        by_name: dict[str, list[int]] = defaultdict(list)
        timelines = report.window_timelines
        for i, w in enumerate(report.windows):
            by_name[w.name].append(i)
        for name, ids in by_name.items():
            annotated = [i for i in ids if timelines[i].basis == WindowBasis.GPU_ANNOTATION]
            if not annotated:
                continue
            # paired in order, every window of the name or none (else the CPU range, a note)
            assert annotated == ids
            intervals = raw.annotations[name]
            assert len(intervals) == len(ids)
            for i, (gs, ge) in zip(sorted(ids, key=lambda i: report.windows[i].start_ns),
                                   intervals, strict=True):  # fmt: skip
                w, t = report.windows[i], timelines[i]
                later = [
                    timelines[j].start_ns
                    for j, o in enumerate(report.windows)
                    if (o.rank, o.group) == (w.rank, w.group)
                    and o.kind != "trace"
                    and (timelines[j].start_ns, j) > (t.start_ns, i)
                ]
                ends = raw.launched_in(w.start_ns, w.end_ns)
                end = ge
                if ends:
                    end = max(ge, min([max(ends), *([min(later)] if later else [])]))
                assert (t.start_ns, t.end_ns) == (gs, end)


def test_kineto_step_windows_busy_fits_and_accounts_add_up(
    analysed: tuple[Raw, list[AnalysisReport]],
) -> None:
    raw, reports = analysed
    for report in reports:
        steps = {(s.rank, s.window, s.name, s.index): s for s in report.step_accounts}
        for t in report.window_timelines:
            assert t.busy_ns == raw.busy(t.start_ns, t.end_ns)
            assert t.busy_ns <= t.total_ns
            assert t.computation_ns + t.exposed_communication_ns + t.exposed_memcpy_ns == t.busy_ns
            step = steps[(t.rank, t.window, t.name, t.index)]
            assert (step.start_ns, step.end_ns) == (t.start_ns, t.end_ns)
            assert sum(p.time_ns for p in step.parts) == step.span_ns == t.total_ns
        for g in report.gpu_timeline:
            assert g.busy_ns <= g.total_ns


def test_the_extension_covers_the_backward_on_the_te_pair() -> None:
    """On the TE pair the autograd thread's backward runs after the arm's annotation ends: the
    window must reach past the annotation (the rule is not vacuous there)."""
    path = next(p for p in KINETO if p.name == "kineto_3arms_rank0.json.gz")
    raw = Raw(path)
    report = analyze_trace(read_kineto(path, rank=0), step_pattern="^arm:").report
    arms = [t for t in report.window_timelines if t.name.startswith("arm:")]
    assert arms and all(t.basis == WindowBasis.GPU_ANNOTATION for t in arms)
    longer = 0
    for t in arms:
        ends = [e for s, e in raw.annotations[t.name] if s == t.start_ns]
        assert len(ends) == 1
        longer += t.end_ns > ends[0]
    assert longer == len(arms)
