"""The whole pipeline on the real TE 2.20.2 traces (2x H200, reference workload, 3 arms)."""

from __future__ import annotations

import numpy as np
import pytest

from analyzers import compare_reports
from analyzers.attribution import MatchedBy
from analyzers.errors import CorruptTraceError, RankConflictError
from analyzers.metrics import per_step
from analyzers.pipeline import Analysis, analyze, analyze_trace
from analyzers.report import Severity
from tests.analyzers.conftest import KINETO_3ARMS, NSYS_3ARMS, TE_DIR, te_manifest
from tests.analyzers.factories import TraceBuilder

HELPER = "get_cu_seqlens_on_cp_rank"
TRITON = "triton_per_fused__to_copy_add_clamp_cumsum_floor_divide_mul_slice_sub_zeros_like_0"


def _helper_ranges(an: Analysis) -> np.ndarray:
    names = an.trace.strings.names
    symbols = [i for i, n in enumerate(names) if n.endswith(HELPER)]
    return np.flatnonzero(np.isin(an.trace.ranges["name"], symbols))


def test_nsys_every_helper_range_has_exactly_one_kernel(nsys_3arms: Analysis) -> None:
    an = nsys_3arms
    rows = _helper_ranges(an)
    assert len(rows) == 256
    claimed = an.attribution.range_row
    per_range = np.bincount(claimed[claimed >= 0], minlength=len(an.trace.ranges))[rows]
    assert (per_range == 1).all()
    kernels = np.isin(claimed, rows)
    assert {an.trace.strings[int(s)] for s in an.trace.activities["name"][kernels]} == {TRITON}
    helper = an.attribution.helper[kernels]
    assert {an.attribution.name_of(int(h)) for h in helper} == {HELPER}


def test_nsys_helper_only_in_the_padded_arm(nsys_3arms: Analysis) -> None:
    report = nsys_3arms.report
    assert report.groups == [
        "nsys_arm:auto_clone",
        "nsys_arm:explicit_false",
        "nsys_arm:auto_same",
        "whole trace",
    ]
    for fast in ("nsys_arm:explicit_false", "nsys_arm:auto_same"):
        assert [h for h in report.helpers if h.window == fast and h.helper == HELPER] == []
        for w in (w for w in report.windows if w.group == fast):
            starts = nsys_3arms.trace.ranges["start"][_helper_ranges(nsys_3arms)]
            ranks = nsys_3arms.trace.ranges["rank"][_helper_ranges(nsys_3arms)]
            inside = (ranks == w.rank) & (starts >= w.start_ns) & (starts <= w.end_ns)
            assert not inside.any()
    slow = [h for h in report.helpers if h.window == "nsys_arm:auto_clone" and h.helper == HELPER]
    # The last three steps of the arm: 4 layers x 2 CP steps x 2 calls per step = 16 per step.
    assert [(h.rank, h.steps, h.launches, h.calls) for h in slow] == [
        (0, 3, 48, 48),
        (1, 3, 48, 48),
    ]
    assert per_step(slow) == 32  # same per-step count as the Kineto capture


def test_kineto_helper_through_python_frames_only_in_auto_clone(kineto_3arms: Analysis) -> None:
    an = kineto_3arms
    helper_index = an.attribution.helper_names.index(HELPER)
    mine = an.attribution.helper == helper_index
    assert (an.attribution.matched_by[mine] == MatchedBy.PYTHON).all()
    assert sorted(np.unique(an.trace.activities["rank"][mine]).tolist()) == [0, 1]
    stats = [h for h in an.report.helpers if h.helper == HELPER and h.window != "whole trace"]
    assert {h.window for h in stats} == {"arm:auto_clone"}
    assert [(h.rank, h.steps, h.launches, h.matched_by) for h in stats] == [
        (0, 3, 48, "python"),
        (1, 3, 48, "python"),
    ]
    # Backward kernels are launched from the autograd thread and still attributed.
    bwd = [
        h
        for h in an.report.helpers
        if h.window == "arm:auto_clone" and h.helper == "te_fused_attn_bwd"
    ]
    assert [h.launches for h in bwd] == [240, 240]


def test_nsys_and_kineto_agree_on_launches_per_arm(
    nsys_3arms: Analysis, kineto_3arms: Analysis
) -> None:
    def launches(an: Analysis, prefix: str) -> dict:
        return {
            (s.rank, s.window.split(":")[1]): s.launches
            for s in an.report.rank_summaries
            if s.window.startswith(prefix)
        }

    assert launches(nsys_3arms, "nsys_arm:") == launches(kineto_3arms, "arm:")


def test_compare_arms_names_the_helper(kineto_3arms: Analysis) -> None:
    report = kineto_3arms.report
    result = compare_reports(
        report, report, base_window="arm:auto_clone", head_window="arm:explicit_false"
    )
    # The compiled helper's one Triton kernel per call is replaced on the fast path by the eager
    # `cu_seqlens // cp` kernel inside cp_p2p_fwd_prepare_qkv: same launch total, other helpers.
    moved = {(d.helper, d.status, d.delta_launches) for d in result.helpers[:2]}
    assert moved == {
        (HELPER, "disappeared", -32.0),
        ("te_cp_p2p_fwd_prepare_qkv", "appeared", 32.0),
    }
    assert HELPER in result.summary and "te_cp_p2p_fwd_prepare_qkv" in result.summary
    changed = [
        d for d in result.helpers if d.status != "unchanged" and abs(d.delta_launches) >= 0.5
    ]
    assert len(changed) == 2
    helper_delta = next(d for d in result.helpers if d.helper == HELPER)
    assert helper_delta.delta_host_time_ns < 0
    assert result.iterations is not None and result.iterations.base.n == 3


def test_findings_on_the_real_run(kineto_3arms: Analysis) -> None:
    findings = kineto_3arms.report.findings
    padded = [f for f in findings if f.rule == "padded-path-without-padding"]
    assert [(f.window, f.severity) for f in padded] == [("arm:auto_clone", Severity.WARNING)]
    assert padded[0].expected_saving_ms and padded[0].expected_saving_ms > 0
    # TE 2.20.2 zero-fills gradient padding in every arm; nothing is padded in any of them.
    zero = sorted(f.window for f in findings if f.rule == "zero-fill-without-padding")
    assert zero == ["arm:auto_clone", "arm:auto_same", "arm:explicit_false"]
    assert not [f for f in findings if f.severity is Severity.ERROR]


def test_real_padding_turns_the_fast_arms_into_errors() -> None:
    padded = [0, 8192, 12288, 14336, 16392]  # a tail pad on the last sequence
    report = analyze(KINETO_3ARMS, manifest=te_manifest("arm", cu_padded=padded))
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert [f.window for f in errors] == ["arm:explicit_false"]
    info = [f for f in report.findings if f.rule == "padded-path-needed"]
    assert [f.window for f in info] == ["arm:auto_clone"]
    assert not [f for f in report.findings if f.rule == "padded-path-without-padding"]


def test_step_pattern_without_manifest(nsys_3arms: Analysis) -> None:
    report = analyze(NSYS_3ARMS, step_pattern=r"^nsys_arm:")
    slow = [h for h in report.helpers if h.helper == HELPER and h.window != "whole trace"]
    assert {h.window for h in slow} == {"nsys_arm:auto_clone"}
    warn = [f for f in report.findings if f.rule == "padded-path-without-padding"]
    assert "manifest" in warn[0].recommendation


def test_missing_rank_is_a_note_not_a_crash() -> None:
    report = analyze([KINETO_3ARMS[0]], manifest=te_manifest("arm"))
    assert report.ranks == [0]
    assert any("rank(s) [1] missing" in n for n in report.notes)
    assert report.imbalance == []
    assert (
        per_step([h for h in report.helpers if h.helper == HELPER and h.window == "arm:auto_clone"])
        == 16
    )


def test_same_rank_twice_is_refused() -> None:
    with pytest.raises(RankConflictError, match="rank 0"):
        analyze([KINETO_3ARMS[0], KINETO_3ARMS[0]])


def test_empty_inputs(tmp_path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text('{"schemaVersion": 1, "traceEvents": []}')
    with pytest.raises(CorruptTraceError, match=r"empty\.json"):
        analyze(empty)
    report = analyze_trace(TraceBuilder().build()).report
    assert report.helpers == [] and report.findings == []
    assert any("no GPU activity" in n for n in report.notes)
    assert TE_DIR.exists()
