"""The clipped GPU timeline of a window, on hand-made intervals whose answer is worked out here.

Every expected number below is computed by hand from the intervals drawn in the comments (ns).
"""

from __future__ import annotations

import numpy as np
import pytest

from analyzers.attribution import attribute
from analyzers.catalog import load_catalog
from analyzers.metrics import gpu_activities
from analyzers.model import GPU_RANGE_DTYPE, ActivityKind, Trace
from analyzers.pipeline import analyze_trace
from analyzers.report import Window, WindowBasis
from analyzers.timeline import (
    GpuActivities,
    TimelineWindow,
    decompose,
    group_timelines,
    timeline_windows,
)
from tests.analyzers.factories import TraceBuilder

K, C, S = ActivityKind.KERNEL, ActivityKind.MEMCPY, ActivityKind.MEMSET


def _acts(rows: list[tuple[int, int, int, ActivityKind, bool]]) -> GpuActivities:
    """(rank, start, end, kind, nccl) rows."""
    return GpuActivities(
        rank=np.array([r[0] for r in rows], dtype=np.int64),
        start=np.array([r[1] for r in rows], dtype=np.int64),
        end=np.array([r[2] for r in rows], dtype=np.int64),
        kind=np.array([int(r[3]) for r in rows], dtype=np.int8),
        communication=np.array([r[4] for r in rows], dtype=bool),
        launched=np.full(len(rows), -1, dtype=np.int64),
    )


def _window(rank: int, start: int, end: int, index: int = 0, group: str = "step") -> TimelineWindow:
    w = Window(
        rank=rank, name=f"{group}#{index}", index=index, kind="step", start_ns=start,
        end_ns=end, group=group,
    )  # fmt: skip
    return TimelineWindow(w, start, end, WindowBasis.CPU_RANGE)


def _parts(t: object) -> tuple[int, ...]:
    return tuple(
        getattr(t, f)
        for f in (
            "total_ns",
            "computation_ns",
            "busy_ns",
            "exposed_memcpy_ns",
            "exposed_communication_ns",
            "idle_ns",
        )
    )


def test_parts_of_one_window_with_overlaps() -> None:
    # window [0, 100)
    # kernel   [10, 30)          computation
    # memset   [25, 40)          computation -> computation union [10, 40) = 30
    # nccl     [35, 60)          exposed comm: [40, 60) = 20
    # memcpy   [55, 70)          exposed memcpy: [60, 70) = 10
    # memcpy   [12, 20)          hidden under the kernel: 0
    acts = _acts(
        [
            (0, 10, 30, K, False),
            (0, 25, 40, S, False),
            (0, 35, 60, K, True),
            (0, 55, 70, C, False),
            (0, 12, 20, C, False),
        ]
    )
    [t] = decompose([_window(0, 0, 100)], acts)
    assert _parts(t) == (100, 30, 60, 10, 20, 40)


def test_activities_crossing_window_ends_are_clipped() -> None:
    # windows [100, 200) and [200, 300); a kernel [50, 150) crosses the first start, an NCCL
    # kernel [180, 260) crosses the boundary between them, a memcpy [290, 400) the last end.
    acts = _acts(
        [
            (0, 50, 150, K, False),
            (0, 180, 260, K, True),
            (0, 290, 400, C, False),
        ]
    )
    first, second = decompose([_window(0, 100, 200, 0), _window(0, 200, 300, 1)], acts)
    # first: kernel [100,150) = 50, nccl [180,200) = 20; busy 70, idle 30
    assert _parts(first) == (100, 50, 70, 0, 20, 30)
    # second: nccl [200,260) = 60, memcpy [290,300) = 10; busy 70, idle 30
    assert _parts(second) == (100, 0, 70, 10, 60, 30)


def test_busy_never_exceeds_total_with_work_longer_than_the_window() -> None:
    # one kernel [0, 1000) covers the whole window [100, 200) and more
    acts = _acts([(0, 0, 1000, K, False), (0, 0, 1000, K, True)])
    [t] = decompose([_window(0, 100, 200)], acts)
    assert _parts(t) == (100, 100, 100, 0, 0, 0)


def test_touching_and_outside_activities_do_not_count() -> None:
    # half-open: [0, 100) ends where the window starts; [200, 250) starts where it ends
    acts = _acts([(0, 0, 100, K, False), (0, 200, 250, K, False), (0, 150, 150, K, False)])
    [t] = decompose([_window(0, 100, 200)], acts)
    assert _parts(t) == (100, 0, 0, 0, 0, 100)


def test_ranks_are_separate() -> None:
    # rank 1's kernel inside rank 0's window must not count for rank 0
    acts = _acts([(1, 10, 90, K, False), (0, 40, 50, K, False)])
    r0, r1 = decompose([_window(0, 0, 100), _window(1, 0, 100)], acts)
    assert (r0.busy_ns, r1.busy_ns) == (10, 80)


def test_overlapping_windows_of_one_group_are_each_measured() -> None:
    # windows [0, 100) and [50, 150) overlap (the slow matching path); kernel [40, 120)
    acts = _acts([(0, 40, 120, K, False)])
    a, b = decompose([_window(0, 0, 100, 0), _window(0, 50, 150, 1)], acts)
    assert (a.computation_ns, b.computation_ns) == (60, 70)


def test_vectorized_pairs_match_brute_force() -> None:
    rng = np.random.default_rng(1)
    n = 400
    start = rng.integers(0, 10_000, n)
    end = start + rng.integers(0, 3_000, n)
    kind = rng.choice([K, C, S], n)
    nccl = (rng.random(n) < 0.3) & (kind == K)
    rank = rng.integers(0, 2, n)
    acts = _acts(list(zip(rank, start, end, kind, nccl, strict=True)))
    bounds = [0, 900, 2500, 2600, 6000, 9000, 12_000]
    windows = [
        _window(r, bounds[i], bounds[i + 1], i) for r in (0, 1) for i in range(len(bounds) - 1)
    ]
    for w, got in zip(windows, decompose(windows, acts), strict=True):
        lo, hi = w.start_ns, w.end_ns
        comp = np.zeros(hi - lo, dtype=bool)
        comm = np.zeros(hi - lo, dtype=bool)
        copy = np.zeros(hi - lo, dtype=bool)
        for r, s, e, k, c in zip(rank, start, end, kind, nccl, strict=True):
            if r != w.window.rank:
                continue
            s, e = max(s, lo) - lo, min(e, hi) - lo
            if e <= s:
                continue
            target = comm if c else copy if k == C else comp
            target[s:e] = True
        busy = comp | comm | copy
        assert _parts(got) == (
            hi - lo,
            int(comp.sum()),
            int(busy.sum()),
            int((copy & ~comp & ~comm).sum()),
            int((comm & ~comp).sum()),
            int((~busy).sum()),
        )


def _annotated_trace(
    gpu_rows: list[tuple[int, int, int]],
    extra: list[tuple[int, int, int]] = (),  # type: ignore[assignment]
    steps: int = 2,
) -> Trace:
    """CPU steps [0, 100) and [100, 200) (``steps``: the first ``steps`` of them); GPU
    annotations (start, end, external id); ``extra`` kernels (launch, start, duration) launched
    from another thread."""
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 100)
    if steps > 1:
        b.range("ProfilerStep#2", 100, 200)
    b.kernel("k", 10, 150, 40)  # launched in step 1, runs [150, 190)
    if steps > 1:
        b.kernel("k", 120, 190, 60)  # launched in step 2, runs [190, 250)
    for launch, start, duration in extra:
        b.kernel("bwd", launch, start, duration, thread=2)
    trace = b.build()
    step1 = trace.strings.intern("ProfilerStep#1")
    step2 = trace.strings.intern("ProfilerStep#2")
    names = [step1, step1, step2]
    trace.gpu_ranges = np.array(
        [(0, 0, 7 + i, s, e, names[i], ext) for i, (s, e, ext) in enumerate(gpu_rows)],
        dtype=GPU_RANGE_DTYPE,
    )
    return trace


def test_kineto_step_window_is_its_gpu_annotation_merged_over_streams() -> None:
    # step 1's annotation on two streams (same External id) [150, 180) and [160, 190);
    # step 2's [190, 250)
    trace = _annotated_trace([(150, 180, 5), (160, 190, 5), (190, 250, 9)])
    report = analyze_trace(trace, catalog=load_catalog()).report
    steps = [t for t in report.window_timelines if t.window == "ProfilerStep"]
    assert [(t.basis, t.start_ns, t.end_ns) for t in steps] == [
        (WindowBasis.GPU_ANNOTATION, 150, 190),
        (WindowBasis.GPU_ANNOTATION, 190, 250),
    ]
    assert [(t.busy_ns, t.idle_ns) for t in steps] == [(40, 0), (60, 0)]
    [group] = [g for g in report.gpu_timeline if g.window == "ProfilerStep"]
    assert (group.steps, group.total_ns, group.busy_ns) == (2, 100, 100)
    summary = next(s for s in report.rank_summaries if s.window == "ProfilerStep")
    assert summary.gpu_busy_ns == 100


def test_kineto_step_window_extends_to_work_launched_in_the_cpu_range() -> None:
    # CPU steps [0, 100) and [100, 200); annotations [150, 190) and [190, 250) (the main
    # thread's kernels). Another thread (autograd) launches, inside step 1, a kernel running
    # [195, 230) and, inside step 2, one running [260, 300): step 1 would end at 230 but stops
    # at the next window's start, 190 (windows never overlap); step 2 ends at 300. (Step 1's
    # annotation is written for two streams, one External id.)
    trace = _annotated_trace(
        [(150, 190, 5), (150, 170, 5), (190, 250, 9)], extra=[(60, 195, 35), (150, 260, 40)]
    )
    report = analyze_trace(trace, catalog=load_catalog()).report
    steps = [t for t in report.window_timelines if t.window == "ProfilerStep"]
    assert [(t.basis, t.start_ns, t.end_ns) for t in steps] == [
        (WindowBasis.GPU_ANNOTATION, 150, 190),
        (WindowBasis.GPU_ANNOTATION, 190, 300),
    ]
    # step 2: [190, 250) + [260, 300) busy, [250, 260) idle
    assert [(t.busy_ns, t.idle_ns) for t in steps] == [(40, 0), (100, 10)]


def test_kineto_step_window_extension_past_the_annotation() -> None:
    # one step [0, 100), annotation [150, 190); another thread's kernel launched at 90 runs
    # [200, 240): the window is [150, 240), with the [190, 200) between them idle
    trace = _annotated_trace([(150, 190, 5)], extra=[(90, 200, 40)], steps=1)
    report = analyze_trace(trace, catalog=load_catalog()).report
    [step] = [t for t in report.window_timelines if t.window == "ProfilerStep"]
    assert (step.start_ns, step.end_ns, step.busy_ns, step.idle_ns) == (150, 240, 80, 10)


def test_unpairable_gpu_annotations_are_projected_with_a_note() -> None:
    # three intervals (no External ids) for two CPU ranges of different names: step 1 gets two,
    # so it is not paired and is projected: [150, 190), its kernel, up to step 2's annotation
    trace = _annotated_trace([(150, 170, -1), (175, 190, -1), (190, 250, -1)])
    windows = [
        Window(rank=0, name=f"ProfilerStep#{i + 1}", index=i, kind="step",
               start_ns=100 * i, end_ns=100 * (i + 1), group="ProfilerStep")
        for i in range(2)
    ]  # fmt: skip
    acts = gpu_activities(trace, attribute(trace, load_catalog()))
    measured, notes = timeline_windows(trace, windows, acts)
    assert [(m.basis, m.start_ns, m.end_ns) for m in measured] == [
        (WindowBasis.GPU_PROJECTION, 150, 190),
        (WindowBasis.GPU_ANNOTATION, 190, 250),
    ]
    assert len(notes) == 2 and "'ProfilerStep#1'" in notes[0] and "not paired" in notes[0]
    assert "1 of 2 'ProfilerStep' step(s)" in notes[1] and "(ProfilerStep#1; 1 paired)" in notes[1]


def test_cpu_windows_clip_work_running_past_the_step() -> None:
    # nsys-like (no GPU annotations): step 1 [0, 100) holds no GPU time although it launched
    # the kernel; step 2 [100, 200) holds [150, 200) of both kernels: 50
    trace = _annotated_trace([])
    report = analyze_trace(trace, catalog=load_catalog()).report
    steps = [t for t in report.window_timelines if t.window == "ProfilerStep"]
    assert [(t.basis, t.busy_ns) for t in steps] == [
        (WindowBasis.CPU_RANGE, 0),
        (WindowBasis.CPU_RANGE, 50),
    ]
    whole = next(t for t in report.window_timelines if t.window == "whole trace")
    assert (whole.basis, whole.total_ns, whole.busy_ns) == (WindowBasis.TRACE, 250, 100)
    for s in report.rank_summaries:
        span = next(g for g in report.gpu_timeline if g.window == s.window).total_ns
        assert s.gpu_busy_ns <= span


def test_group_sums_keep_the_step_count() -> None:
    acts = _acts([(0, 0, 10, K, False)])
    parts = decompose([_window(0, 0, 50, 0), _window(0, 50, 100, 1)], acts)
    [g] = group_timelines(parts, {(0, "step"): 6})
    assert (g.steps, g.windows, g.total_ns, g.busy_ns, g.idle_ns) == (6, 2, 100, 10, 90)


@pytest.mark.parametrize("n_windows", [0, 1])
def test_no_activity_is_all_idle(n_windows: int) -> None:
    windows = [_window(0, 0, 100)][:n_windows]
    out = decompose(windows, _acts([]))
    assert [_parts(t) for t in out] == [(100, 0, 0, 0, 0, 100)][:n_windows]
