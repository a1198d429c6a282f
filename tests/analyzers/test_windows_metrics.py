"""Windows (steps, variants, whole trace) and metrics (helpers, busy/gaps, imbalance, timeline)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from analyzers.attribution import attribute, match_ranges
from analyzers.catalog import builtin_catalog
from analyzers.metrics import GAP_THRESHOLD_NS, compute_metrics, interval_union
from analyzers.model import ActivityKind, RangeKind
from analyzers.windows import WHOLE_TRACE, find_windows, step_group_name
from tests.analyzers.factories import TraceBuilder

CATALOG = builtin_catalog()
US = 1000


def _two_arm_trace() -> TraceBuilder:
    """Two ranks; per rank: arm:a holds steps 1-2, arm:b holds step 3; a helper only in arm:a."""
    b = TraceBuilder()
    for rank, thread, process in ((0, 1, 100), (1, 2, 200)):
        kw = {"thread": thread, "rank": rank, "process": process}
        b.range("arm:a", 0, 2000 * US, **kw)
        b.range("arm:b", 3000 * US, 4000 * US, **kw)
        for step, start in enumerate((0, 1000 * US, 3000 * US), start=1):
            b.range(f"ProfilerStep#{step}", start, start + 900 * US, kind=RangeKind.STEP, **kw)
            t = start + 10 * US
            if start < 2000 * US:
                b.range("cp_attention.metadata", t, t + 50 * US, **kw)
                b.kernel("meta_kernel", t + 5 * US, t + 100 * US, 10 * US, **kw)
            b.range("cp_attention.attn_fwd_step", t + 60 * US, t + 200 * US, **kw)
            # rank 1 does twice the attention work: a measurable imbalance
            b.kernel("attn", t + 70 * US, t + 200 * US, 100 * US * (1 + rank), **kw)
            b.kernel("attn", t + 80 * US, t + 600 * US, 100 * US, **kw)
    return b


def test_step_group_name() -> None:
    assert step_group_name("ProfilerStep#12") == "ProfilerStep"
    assert step_group_name("iter 3") == "iter"
    assert step_group_name("arm:auto_clone") == "arm:auto_clone"


def test_windows_from_steps_variants_and_whole_trace() -> None:
    trace = _two_arm_trace().build()
    plain = find_windows(trace)
    assert {(w.group, w.kind) for w in plain} == {("ProfilerStep", "step"), (WHOLE_TRACE, "trace")}
    assert [w.index for w in plain if w.rank == 0 and w.kind == "step"] == [0, 1, 2]
    arms = find_windows(trace, window_names=["arm:a", "arm:b"])
    steps = {(w.rank, w.group): 0 for w in arms}
    for w in arms:
        steps[(w.rank, w.group)] += 1
    assert steps == {
        (0, "arm:a"): 2,
        (0, "arm:b"): 1,
        (1, "arm:a"): 2,
        (1, "arm:b"): 1,
        (0, WHOLE_TRACE): 1,
        (1, WHOLE_TRACE): 1,
    }
    by_pattern = find_windows(trace, step_pattern=r"^arm:")
    assert {w.group for w in by_pattern} == {"arm:a", "arm:b", WHOLE_TRACE}
    assert all(w.kind in ("step", "trace") for w in by_pattern)
    with pytest.raises(re.error):
        find_windows(trace, step_pattern="(")


def test_variant_window_without_steps_is_its_own_step() -> None:
    b = TraceBuilder()
    b.range("nsys_arm:x", 0, 100, kind=RangeKind.NVTX)
    b.kernel("k", 10, 20, 5)
    windows = find_windows(b.build(), window_names=["nsys_arm:x", "nsys_arm:absent"])
    assert [(w.group, w.kind) for w in windows] == [
        ("nsys_arm:x", "window"),
        (WHOLE_TRACE, "trace"),
    ]


def test_profiler_step_wrapping_an_arm_is_a_step_of_that_arm() -> None:
    """``runners`` records each profiled A/B step as ``ProfilerStep#N`` around ``arm:<name>``:
    the step belongs to the arm, and no mixed "ProfilerStep" group appears."""
    b = TraceBuilder()
    for step, (arm, start) in enumerate((("arm:a", 0), ("arm:a", 1000), ("arm:b", 2000)), 1):
        b.range(f"ProfilerStep#{step}", start, start + 1000, kind=RangeKind.STEP)
        b.range(arm, start + 20, start + 990)
        b.kernel("k", start + 30, start + 40, 5)
    b.range("ProfilerStep#4", 3000, 5000, kind=RangeKind.STEP)  # wraps both arms: mixed
    b.range("arm:a", 3010, 3900)
    b.range("arm:b", 4010, 4900)
    windows = find_windows(b.build(), window_names=["arm:a", "arm:b"])
    got = [(w.name, w.group, w.kind) for w in windows if w.kind != "trace"]
    assert got == [
        ("ProfilerStep#1", "arm:a", "step"),
        ("ProfilerStep#2", "arm:a", "step"),
        ("arm:a", "arm:a", "window"),  # inside the mixed step: counted as a window of its own
        ("ProfilerStep#3", "arm:b", "step"),
        ("arm:b", "arm:b", "window"),
        ("ProfilerStep#4", "ProfilerStep", "step"),
    ]


def test_gpu_mirror_of_annotation_is_not_a_second_step() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 100, thread=1)
    b.range("ProfilerStep#1", 5, 120, thread=99)  # Kineto gpu_user_annotation on a stream row
    b.kernel("k", 10, 20, 5, thread=1)
    steps = [w for w in find_windows(b.build()) if w.kind == "step"]
    assert len(steps) == 1 and steps[0].end_ns == 100


def test_interval_union_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    seg = rng.integers(0, 4, 300)
    start = rng.integers(0, 200_000, 300)
    end = start + rng.integers(0, 20_000, 300)
    busy, gaps, gap_ns = interval_union(seg, start, end, 5)
    for s in range(5):
        mask = np.zeros(220_001, dtype=bool)
        for a, e in zip(start[seg == s], end[seg == s], strict=True):
            mask[a:e] = True
        assert busy[s] == mask.sum()
        covered = np.flatnonzero(mask)
        if len(covered):
            holes = np.diff(covered) - 1
            assert gaps[s] == (holes > GAP_THRESHOLD_NS).sum()
            assert gap_ns[s] == holes[holes > GAP_THRESHOLD_NS].sum()
        else:
            assert gaps[s] == 0


def test_metrics_per_group_helper_stream_rank_and_imbalance() -> None:
    trace = _two_arm_trace().build()
    ranges = match_ranges(trace, CATALOG)
    att = attribute(trace, CATALOG, ranges)
    windows = find_windows(trace, window_names=["arm:a", "arm:b"])
    m = compute_metrics(trace, att, ranges, CATALOG, windows)
    assert m.groups == ["arm:a", "arm:b", WHOLE_TRACE]
    meta = m.helper_stats("arm:a", "cp_attention.metadata")
    assert [(h.rank, h.steps, h.launches, h.calls, h.host_time_ns) for h in meta] == [
        (0, 2, 2, 2, 100 * US),
        (1, 2, 2, 2, 100 * US),
    ]
    assert m.helper_stats("arm:b", "cp_attention.metadata") == []
    attn = m.helper_stats("arm:b", "cp_attention.attn_fwd_step")
    assert [(h.launches, h.gpu_time_ns) for h in attn] == [(2, 200 * US), (2, 300 * US)]
    stream = next(s for s in m.streams if s.window == "arm:b" and s.rank == 0)
    assert stream.busy_ns == 200 * US and stream.gaps == 1 and stream.gap_ns == 300 * US
    busy = next(i for i in m.imbalance if i.window == "arm:b" and i.metric == "compute_busy_ns")
    assert busy.per_rank == {0: 200 * US, 1: 300 * US} and busy.max_over_min == pytest.approx(1.5)
    summary = next(s for s in m.rank_summaries if s.window == "arm:a" and s.rank == 0)
    assert summary.kernels == 6 and summary.attributed_fraction == 1.0
    assert m.timeline is not None and m.timeline.window == "arm:a"
    assert {e.rank for e in m.timeline.events} == {0, 1}


def test_timeline_is_decimated_to_longest() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 10_000)
    for i in range(50):
        b.kernel(f"k{i}", 10 + i, 100 + 100 * i, 1 + i)
    trace = b.build()
    ranges = match_ranges(trace, CATALOG)
    att = attribute(trace, CATALOG, ranges)
    m = compute_metrics(trace, att, ranges, CATALOG, find_windows(trace), timeline_limit=10)
    assert m.timeline is not None and m.timeline.dropped == 40
    assert sorted(e.end_ns - e.start_ns for e in m.timeline.events) == list(range(41, 51))


def test_host_syncs_are_found_labelled_and_attributed() -> None:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 1000 * US)
    b.range(
        "megatron/utils.py(10): get_batch_on_this_cp_rank", 10 * US, 200 * US, kind=RangeKind.PYTHON
    )
    b.range("aten::_local_scalar_dense", 20 * US, 120 * US, kind=RangeKind.CPU_OP)
    b.kernel(
        "Memcpy DtoH (Device -> Pageable)",
        30 * US,
        40 * US,
        5 * US,
        kind=ActivityKind.MEMCPY,
        api="cudaMemcpyAsync",
    )
    b.api_call("cudaStreamSynchronize", 500 * US, 700 * US)  # outside any helper
    b.kernel(
        "Memcpy DtoH (Device -> Pageable)",
        2000 * US,
        2010 * US,
        5 * US,
        kind=ActivityKind.MEMCPY,
        api="cudaMemcpyAsync",
    )  # outside the step
    trace = b.build()
    ranges = match_ranges(trace, CATALOG)
    att = attribute(trace, CATALOG, ranges)
    m = compute_metrics(trace, att, ranges, CATALOG, find_windows(trace))
    step = {s.helper: s for s in m.host_syncs if s.window == "ProfilerStep"}
    assert step["get_batch_on_this_cp_rank"].calls == 1
    assert step["get_batch_on_this_cp_rank"].api == "aten::_local_scalar_dense"
    assert step["(unattributed)"].api == "cudaStreamSynchronize"
    assert step["(unattributed)"].blocked_ns == 200 * US
    whole = sum(s.calls for s in m.host_syncs if s.window == WHOLE_TRACE)
    assert whole == 3


def test_steps_per_window_divides_per_step_numbers() -> None:
    b = TraceBuilder(fmt="nsys")
    b.range("nsys_arm:x", 0, 4000 * US, kind=RangeKind.NVTX)  # four steps, none marked
    b.range("cp_attention.merge", 10 * US, 20 * US, kind=RangeKind.NVTX)
    b.kernel("k", 15 * US, 100 * US, 10 * US)
    trace = b.build()
    ranges = match_ranges(trace, CATALOG)
    att = attribute(trace, CATALOG, ranges)
    windows = find_windows(trace, window_names=["nsys_arm:x"])
    m = compute_metrics(trace, att, ranges, CATALOG, windows, steps_per_window={"nsys_arm:x": 4})
    assert m.steps[(0, "nsys_arm:x")] == 4
    assert m.durations_ms[(0, "nsys_arm:x")] == [1.0] * 4
    assert m.helper_stats("nsys_arm:x", "cp_attention.merge")[0].steps == 4
    # Steps marked inside the window win over the manifest's count.
    b.range("ProfilerStep#1", 0, 1000 * US, kind=RangeKind.STEP)
    trace = b.build()
    ranges = match_ranges(trace, CATALOG)
    att = attribute(trace, CATALOG, ranges)
    windows = find_windows(trace, window_names=["nsys_arm:x"])
    m = compute_metrics(trace, att, ranges, CATALOG, windows, steps_per_window={"nsys_arm:x": 4})
    assert m.steps[(0, "nsys_arm:x")] == 1
