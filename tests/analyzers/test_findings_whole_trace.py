"""Whole-trace numbers never say "per step" (issue 25, defect 4).

A variant without a window of its own is judged over the whole trace: its totals include
start-up and the first, compiling call, so they are totals and say so ("in the whole trace").
Real TE 2.20.2 nsys export, its auto_clone arm's facts without a window.
"""

from __future__ import annotations

from analyzers.manifest import parse_manifest
from analyzers.pipeline import run_analysis
from analyzers.report import AccountPartKind
from analyzers.windows import WHOLE_TRACE
from tests.analyzers.conftest import EQUAL_CU, NSYS_3ARMS, WORKLOAD


def test_whole_trace_findings_say_whole_trace_never_per_step() -> None:
    facts = {
        "cu_seqlens": EQUAL_CU,
        "cu_seqlens_padded": EQUAL_CU,
        "padded_is_same_object": False,
        "pad_between_seqs": None,
    }
    manifest = parse_manifest(
        {"workload": WORKLOAD, "variants": [{"name": "auto_clone", "facts": facts}]}
    )
    report = run_analysis(NSYS_3ARMS, manifest=manifest).report
    whole = [f for f in report.findings if f.window == WHOLE_TRACE]
    assert {f.rule for f in whole} >= {"padded-path-without-padding"}
    for finding in whole:
        texts = [finding.title, finding.recommendation, *(e.name for e in finding.evidence)]
        assert not [t for t in texts if "per step" in t], finding
    (padded,) = [f for f in whole if f.rule == "padded-path-without-padding"]
    assert "ms in the whole trace because of get_cu_seqlens_on_cp_rank" in padded.title
    idle = [e for e in padded.evidence if e.name.startswith("GPU idle in the whole trace")]
    groups = {g.rank: g for g in report.accounts if g.window == WHOLE_TRACE}
    for e in idle:  # the totals, not divided by the whole trace's one "step"
        parts = groups[e.rank].parts
        ns = sum(
            p.time_ns
            for p in parts
            if p.part is AccountPartKind.IDLE_HOST and p.label == "get_cu_seqlens_on_cp_rank"
        )
        assert e.value == round(ns / 1e6, 4)
    assert sorted(e.rank for e in idle) == [0, 1]
