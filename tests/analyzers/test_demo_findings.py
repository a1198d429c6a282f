"""Findings on the real demo bundles (2x H200) checked against each bundle's own manifest facts.

These pin what a CP-attention engineer would check by hand: savings come from the bundle's
timed arms when one runs without the helper (else an estimate that never uses profiled host
time), profiled steps are grouped by the arm they wrap, and no finding contradicts the facts.
"""

from __future__ import annotations

import numpy as np
import pytest
from testkit import demo_bundle

from analyzers import compare_reports
from analyzers.bundle import read_bundle
from analyzers.findings.context import LAUNCH_HOST_COST_US
from analyzers.manifest import RunManifest
from analyzers.pipeline import analyze
from analyzers.report import AnalysisReport, Finding, Severity

REFERENCE = "te-2.20.2-reference-3arms-h200x2"
ADAPTER = "te-2.20.2-adapter-vs-stock-h200x2"
BUNDLED = "bundled-fixed-vs-broken-h200x2"
ALLGATHER = "allgather-bundled-dcs-vs-nlb-h200x2"
PADDED = "padded-path-without-padding"
ZERO_FILL = "zero-fill-without-padding"
METADATA_HELPER = "get_cu_seqlens_on_cp_rank"
ZERO_FILL_HELPERS = {
    "te_thd_grad_zero_fill",
    "te_thd_grad_zero_fill_inline",
    "cp_attention.grad_zero_fill",
}

_CACHE: dict[str, tuple[AnalysisReport, RunManifest]] = {}


def _load(name: str) -> tuple[AnalysisReport, RunManifest]:
    """Analyze a demo bundle once per test session (a few seconds each)."""
    if name not in _CACHE:
        path = demo_bundle(name)
        with read_bundle(path) as bundle:
            manifest = bundle.manifest
        assert manifest is not None
        _CACHE[name] = (analyze(path), manifest)
    return _CACHE[name]


def _timed_median(manifest: RunManifest, arm: str) -> float:
    """Median over iterations of the slowest rank, straight from the manifest's CUDA events."""
    variant = next(v for v in manifest.variants if v.name == arm)
    samples = np.array([variant.iteration_ms[r] for r in sorted(variant.iteration_ms)])
    return float(np.median(samples.max(axis=0)))


def _finding(report: AnalysisReport, rule: str, window: str) -> Finding:
    return next(f for f in report.findings if f.rule == rule and f.window == window)


def _evidence(finding: Finding, prefix: str) -> object:
    return next(e.value for e in finding.evidence if e.name.startswith(prefix))


def _per_step(report: AnalysisReport, window: str, helpers: set[str]) -> float:
    return sum(
        h.launches / max(h.steps, 1)
        for h in report.helpers
        if h.window == window and h.helper in helpers
    )


def test_reference_profiled_steps_belong_to_their_arms() -> None:
    report, _ = _load(REFERENCE)
    assert report.groups == [
        "arm:auto_clone",
        "arm:explicit_false",
        "arm:auto_same",
        "whole trace",
    ]
    steps = [w for w in report.windows if w.kind == "step"]
    assert len(steps) == 18 and all(w.name.startswith("ProfilerStep#") for w in steps)
    for summary in report.rank_summaries:
        if summary.window != "whole trace":
            assert summary.steps == 3
    # the iteration table holds the 50 timed iterations per arm, nothing profiled
    rows = [it for it in report.iterations if it.rank is None]
    assert [(it.label, it.n, it.source) for it in rows] == [
        ("arm:auto_clone", 50, "timed"),
        ("arm:explicit_false", 50, "timed"),
        ("arm:auto_same", 50, "timed"),
    ]


def test_reference_padded_path_saving_is_the_measured_arm_difference() -> None:
    report, manifest = _load(REFERENCE)
    finding = _finding(report, PADDED, "arm:auto_clone")
    expected = _timed_median(manifest, "auto_clone") - _timed_median(manifest, "explicit_false")
    # the smaller of the two arms without the helper (auto_same is faster still): conservative
    assert expected < _timed_median(manifest, "auto_clone") - _timed_median(manifest, "auto_same")
    assert finding.saving_basis == "measured"
    assert finding.expected_saving_ms == pytest.approx(expected, abs=1e-3)
    assert _evidence(
        finding, "median iteration difference to arm 'explicit_false'"
    ) == pytest.approx(expected, abs=1e-3)
    basis = str(_evidence(finding, "saving basis"))
    assert "'auto_clone'" in basis and "'explicit_false'" in basis and "n=50" in basis
    assert not [f for f in report.findings if f.rule == PADDED and f.window != "arm:auto_clone"]


def test_reference_zero_fill_saving_is_an_estimate_not_profiled_host_time() -> None:
    report, _ = _load(REFERENCE)
    for arm in ("auto_clone", "explicit_false", "auto_same"):
        finding = _finding(report, ZERO_FILL, f"arm:{arm}")
        stats = [
            h for h in report.helpers if h.window == f"arm:{arm}" and h.helper in ZERO_FILL_HELPERS
        ]
        estimate = max(
            (h.gpu_time_ns / 1e6 + h.launches * LAUNCH_HOST_COST_US / 1e3) / h.steps for h in stats
        )
        host = max(h.host_time_ns / 1e6 / h.steps for h in stats)
        assert finding.saving_basis == "estimate"
        assert finding.expected_saving_ms == pytest.approx(estimate, abs=1e-3)
        # 92 launches and ~0.72 ms GPU: about DESIGN's measured 1.6 ms, far below the 2.6-4.7 ms
        # of host time the Python-stack profiler recorded inside the helper
        assert 1.2 < finding.expected_saving_ms < 2.0 < host
        # TE 2.20.2 zero-fills on every path: the fast-path arms prove it, so they are not the fix
        assert "neither pad_between_seqs=False" in finding.recommendation
        assert (
            _evidence(finding, "arms of this run on TE's unpadded path")
            == "explicit_false, auto_same"
        )


def test_adapter_vs_stock() -> None:
    report, manifest = _load(ADAPTER)
    assert report.groups == ["arm:te_stock", "arm:te_adapter", "whole trace"]
    assert _per_step(report, "arm:te_adapter", {METADATA_HELPER}) == 0
    assert not [f for f in report.findings if f.rule == PADDED and f.window == "arm:te_adapter"]
    stock = _finding(report, PADDED, "arm:te_stock")
    # the adapter arm runs without the helper but is slower in the timed iterations: no measured
    # saving can be claimed from it, so the finding estimates and says why
    slower = _timed_median(manifest, "te_stock") - _timed_median(manifest, "te_adapter")
    assert slower < 0
    assert stock.saving_basis == "estimate"
    assert _evidence(stock, "median iteration difference to arm 'te_adapter'") == pytest.approx(
        slower, abs=1e-3
    )
    assert stock.expected_saving_ms is not None and stock.expected_saving_ms < 0.5
    adapter_fill = _finding(report, ZERO_FILL, "arm:te_adapter")
    assert "nor cp_attention.te_adapter.AdaptedDotProductAttention removes it" in (
        adapter_fill.recommendation
    )


def test_bundled_fixed_arm_is_clean_and_broken_arms_compare_to_the_right_arm() -> None:
    report, manifest = _load(BUNDLED)
    assert _per_step(report, "arm:fixed", {METADATA_HELPER, *ZERO_FILL_HELPERS}) == 0
    # The harness's cudaStreamSynchronize calls inside every step (the readers keep sync API
    # rows) are reported as information only, outside any helper; nothing else fires.
    fixed = [f for f in report.findings if f.window == "arm:fixed"]
    assert [(f.rule, f.severity, f.helper) for f in fixed] == [
        ("host-sync-in-step", Severity.INFO, None)
    ]
    assert fixed[0].evidence[0].name.startswith("blocking cudaStreamSynchronize calls per step")
    assert not [f for f in report.findings if f.rule == "fast-path-with-padding"]

    def measured(rule: str, arm: str, other: str) -> None:
        finding = _finding(report, rule, f"arm:{arm}")
        assert finding.saving_basis == "measured"
        expected = _timed_median(manifest, arm) - _timed_median(manifest, other)
        assert finding.expected_saving_ms == pytest.approx(expected, abs=1e-3)
        assert _evidence(finding, f"median iteration difference to arm {other!r}") is not None

    measured(PADDED, "broken_identity", "fixed")
    measured(ZERO_FILL, "broken_zero_fill", "fixed")
    # broken_both: each fix is measured against the arm that still has the other problem
    measured(PADDED, "broken_both", "broken_zero_fill")
    measured(ZERO_FILL, "broken_both", "broken_identity")
    padded = _finding(report, PADDED, "arm:broken_identity")
    assert padded.title.startswith("The bundled cp_attn") and "broken_identity_padding" in (
        padded.recommendation
    )


def test_allgather_no_load_balance_imbalance_is_predicted_and_measured() -> None:
    report, manifest = _load(ALLGATHER)
    imbalance = [f for f in report.findings if f.rule == "causal-imbalance"]
    assert [f.window for f in imbalance] == ["arm:bundled_nlb"]
    finding = imbalance[0]
    # seqlens 8192/4096/2048/2048 on 2 ranks: rank 0 holds all of the 8192 sequence
    assert _evidence(finding, "causal work max/min under NoLoadBalance") == pytest.approx(
        2.667, abs=1e-3
    )
    assert "rank 0" in finding.title
    measured = _evidence(finding, "attention GPU time max/min (measured)")
    assert isinstance(measured, float) and measured > 1.5
    expected = _timed_median(manifest, "bundled_nlb") - _timed_median(manifest, "bundled_dcs")
    assert finding.saving_basis == "measured"
    assert finding.expected_saving_ms == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("name", [REFERENCE, ADAPTER, BUNDLED, ALLGATHER])
def test_no_saving_exceeds_the_arm_and_every_saving_says_how_it_was_obtained(name: str) -> None:
    report, _ = _load(name)
    medians = {it.label: it.median_ms for it in report.iterations if it.rank is None}
    for finding in report.findings:
        if finding.expected_saving_ms is None:
            continue
        assert finding.saving_basis in ("measured", "estimate")
        assert finding.expected_saving_ms <= medians[finding.window or ""]


def test_compare_arms_uses_timed_iterations_and_refuses_to_mix_sources() -> None:
    report, manifest = _load(REFERENCE)
    diff = compare_reports(
        report, report, base_window="arm:auto_clone", head_window="arm:explicit_false"
    )
    assert diff.iterations is not None and diff.iterations.base.n == 50
    assert diff.iterations.delta_median_ms == pytest.approx(
        _timed_median(manifest, "explicit_false") - _timed_median(manifest, "auto_clone"), abs=1e-3
    )
    profiled = report.model_copy(
        update={
            "iterations": [
                it.model_copy(update={"source": "profiled"})
                if it.label == "arm:explicit_false"
                else it
                for it in report.iterations
            ]
        }
    )
    mixed = compare_reports(
        report, profiled, base_window="arm:auto_clone", head_window="arm:explicit_false"
    )
    assert mixed.iterations is None
    assert "iterations not compared: arm:auto_clone is timed, arm:explicit_false is profiled" in (
        mixed.summary
    )
