"""Small, hand-built report models for the web tests (shaped like the reference workload).

The numbers follow DESIGN.md (stock 21.28 ms vs explicit_false 18.59 ms; 48
``get_cu_seqlens_on_cp_rank`` launches per rank only in the slow arm); helper and kernel names
include C++ template brackets on purpose, to exercise escaping.
"""

from __future__ import annotations

import random

from analyzers.report import (
    AnalysisReport,
    Category,
    ComparisonReport,
    Evidence,
    Finding,
    HelperDelta,
    HelperStat,
    IterationComparison,
    IterationStats,
    RankSummary,
    Severity,
    Timeline,
    TimelineEvent,
)

TEMPLATE_KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>"
TEMPLATE_HELPER = "zero_fill<dQ>"


def iteration_stats(label: str, rank: int | None, median: float, n: int = 20) -> IterationStats:
    rng = random.Random(f"{label}{rank}")
    samples = sorted(median + rng.gauss(0, 0.15) for _ in range(n))
    return IterationStats(
        label=label,
        rank=rank,
        n=n,
        median_ms=samples[n // 2],
        p10_ms=samples[n // 10],
        p90_ms=samples[(9 * n) // 10],
        iqr_ms=samples[(3 * n) // 4] - samples[n // 4],
        mean_ms=sum(samples) / n,
        min_ms=samples[0],
        max_ms=samples[-1],
        samples_ms=samples,
    )


def helper_stats() -> list[HelperStat]:
    rows = []
    for rank in (0, 1):
        for window, cu_launches, zero in (("arm:auto_clone", 48, 36), ("arm:explicit_false", 0, 0)):
            rows.append(
                HelperStat(
                    rank=rank,
                    window=window,
                    steps=3,
                    helper="attn_fwd_step",
                    category=Category.ATTENTION,
                    launches=24,
                    kernels=24,
                    gpu_time_ns=24_000_000,
                    matched_by="range",
                )
            )
            if cu_launches:
                rows.append(
                    HelperStat(
                        rank=rank,
                        window=window,
                        steps=3,
                        helper="get_cu_seqlens_on_cp_rank",
                        category=Category.METADATA,
                        launches=cu_launches,
                        kernels=cu_launches,
                        gpu_time_ns=cu_launches * 4000,
                        matched_by="python",
                    )
                )
            if zero:
                rows.append(
                    HelperStat(
                        rank=rank,
                        window=window,
                        steps=3,
                        helper=TEMPLATE_HELPER,
                        category=Category.ZERO_FILL,
                        launches=zero,
                        kernels=zero,
                        gpu_time_ns=zero * 9000,
                        matched_by="kernel-name",
                    )
                )
    return rows


def timeline() -> Timeline:
    events = []
    for rank in (0, 1):
        t = 0
        for i in range(40):
            helper, cat, name = (
                (TEMPLATE_HELPER, Category.ZERO_FILL, TEMPLATE_KERNEL)
                if i % 4 == 0
                else ("attn_fwd_step", Category.ATTENTION, "cudnn_fused_attn_fwd")
            )
            events.append(
                TimelineEvent(
                    rank=rank,
                    stream=7,
                    start_ns=t,
                    end_ns=t + 5000 + i * 10,
                    name=name,
                    helper=helper,
                    category=cat,
                )
            )
            t += 6000
    return Timeline(window="arm:auto_clone", limit=1000, dropped=0, events=events)


def finding() -> Finding:
    return Finding(
        rule="padded-path-without-padding",
        title="Padded THD path taken without padding",
        severity=Severity.WARNING,
        helper="get_cu_seqlens_on_cp_rank",
        window="arm:auto_clone",
        ranks=[0, 1],
        evidence=[
            Evidence(
                name="get_cu_seqlens_on_cp_rank launches per step",
                value=16,
                unit="launches",
                rank=0,
                window="arm:auto_clone",
            )
        ],
        recommendation="Pass pad_between_seqs=False to DotProductAttention <fast path>.",
        expected_saving_ms=2.69,
        expected_saving_pct=12.6,
        references=["TE issue #3331"],
    )


def analysis_report() -> AnalysisReport:
    return AnalysisReport(
        catalog_version="te_cp-1",
        sources=[],
        ranks=[0, 1],
        windows=[],
        helpers=helper_stats(),
        streams=[],
        rank_summaries=[
            RankSummary(
                rank=r,
                window="arm:auto_clone",
                steps=3,
                span_ns=63_840_000,
                gpu_busy_ns=60_000_000,
                kernels=900,
                launches=950,
                attributed_fraction=0.97,
            )
            for r in (0, 1)
        ],
        imbalance=[],
        iterations=[
            iteration_stats(label, rank, median)
            for label, median in (("auto_clone", 21.28), ("explicit_false", 18.59))
            for rank in (0, 1)
        ],
        findings=[finding()],
        timeline=timeline(),
    )


def comparison_report(*, slower: bool = False) -> ComparisonReport:
    base = iteration_stats("auto_clone", None, 21.28, n=50)
    head = iteration_stats("explicit_false", None, 18.59, n=50)
    if slower:
        base, head = head, base
    delta = head.median_ms - base.median_ms
    verdict = "slower" if slower else "faster"
    sign = 1 if slower else -1
    return ComparisonReport(
        base_label=base.label,
        head_label=head.label,
        helpers=[
            HelperDelta(
                helper="get_cu_seqlens_on_cp_rank",
                category=Category.METADATA,
                base_launches=32.0,
                head_launches=0.0,
                delta_launches=-32.0,
                base_gpu_time_ns=128_000,
                head_gpu_time_ns=0,
                delta_gpu_time_ns=-128_000,
                status="disappeared",
            ),
            HelperDelta(
                helper=TEMPLATE_HELPER,
                category=Category.ZERO_FILL,
                base_launches=24.0,
                head_launches=0.0,
                delta_launches=-24.0,
                base_gpu_time_ns=216_000,
                head_gpu_time_ns=0,
                delta_gpu_time_ns=-216_000,
                status="disappeared",
            ),
            HelperDelta(
                helper="attn_fwd_step",
                category=Category.ATTENTION,
                base_launches=16.0,
                head_launches=16.0,
                delta_launches=0.0,
                base_gpu_time_ns=16_000_000,
                head_gpu_time_ns=16_000_000,
                delta_gpu_time_ns=0,
                status="unchanged",
            ),
        ],
        span_delta_ns=sign * 2_690_000,
        busy_delta_ns=sign * 344_000,
        iterations=IterationComparison(
            base=base,
            head=head,
            delta_median_ms=delta,
            delta_median_pct=100 * delta / base.median_ms,
            ci_low_ms=delta - 0.1,
            ci_high_ms=delta + 0.1,
            confidence=0.95,
            p_value=1.2e-9,
            method="Mann-Whitney U; Hodges-Lehmann CI",
            verdict=verdict,
        ),
        findings_base=[finding()],
        findings_head=[],
        summary=f"head is {abs(delta):.2f} ms {verdict}: get_cu_seqlens_on_cp_rank disappeared",
        verdict=verdict,
    )
