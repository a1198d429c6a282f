"""What every rule sees: the metrics of one window group plus the manifest facts that apply to it.

A *target* pairs a window group with the manifest variant describing it (matched by the
variant's ``window`` name; a manifest whose single variant has no window describes every group),
and the workload with that variant's overrides applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from analyzers.catalog import Catalog
from analyzers.manifest import MetadataFacts, RunManifest, VariantManifest, Workload
from analyzers.metrics import Metrics, per_step
from analyzers.report import Category, Evidence, HelperStat, IterationStats
from analyzers.windows import WHOLE_TRACE


@dataclass(slots=True)
class Target:
    """One window group and the facts known about it."""

    group: str
    variant: VariantManifest | None
    workload: Workload
    facts: MetadataFacts

    @property
    def label(self) -> str:
        return self.variant.name if self.variant else self.group


@dataclass(slots=True)
class RuleContext:
    metrics: Metrics
    manifest: RunManifest | None
    catalog: Catalog
    iterations: Sequence[IterationStats] = field(default_factory=tuple)

    def targets(self) -> list[Target]:
        """Window groups to judge: every variant's group, else every step group."""
        step_groups = [g for g in self.metrics.groups if g != WHOLE_TRACE] or [WHOLE_TRACE]
        manifest = self.manifest
        if manifest is None or not manifest.variants:
            workload = manifest.workload if manifest else Workload()
            return [Target(g, None, workload, MetadataFacts()) for g in step_groups]
        out = []
        for variant in manifest.variants:
            groups = [variant.window] if variant.window else step_groups
            for group in groups:
                if group in self.metrics.groups:
                    out.append(
                        Target(group, variant, manifest.effective_workload(variant), variant.facts)
                    )
        return out

    def helpers_feeding(self, rule: str) -> list[str]:
        return [h.name for h in self.catalog.helpers if h.finding == rule]

    def stats(self, group: str, helpers: Sequence[str]) -> list[HelperStat]:
        return [h for h in self.metrics.helpers if h.window == group and h.helper in helpers]

    def category_launches(self, group: str, category: Category) -> float:
        return per_step(
            [h for h in self.metrics.helpers if h.window == group and h.category == category]
        )

    def iteration_median(self, group: str) -> float | None:
        """Median iteration time (ms) of a group over all ranks, if known."""
        for it in self.iterations:
            if it.label == group and it.rank is None:
                return it.median_ms
        return None


def helper_evidence(stats: Sequence[HelperStat], group: str) -> list[Evidence]:
    """Per-rank launches, GPU time and host time per step of some helpers."""
    by_rank: dict[int, list[HelperStat]] = {}
    for s in stats:
        by_rank.setdefault(s.rank, []).append(s)
    out = []
    for rank, rows in sorted(by_rank.items()):
        steps = max(rows[0].steps, 1)
        names = ", ".join(sorted({r.helper for r in rows}))
        out += [
            Evidence(
                name=f"launches per step ({names})",
                value=round(sum(r.launches for r in rows) / steps, 2),
                rank=rank,
                window=group,
            ),
            Evidence(
                name="GPU time per step",
                value=round(sum(r.gpu_time_ns for r in rows) / steps / 1e6, 4),
                unit="ms",
                rank=rank,
                window=group,
            ),
            Evidence(
                name="host time in the helper per step",
                value=round(sum(r.host_time_ns for r in rows) / steps / 1e6, 4),
                unit="ms",
                rank=rank,
                window=group,
            ),
        ]
    return out


def measured_cost_ms(stats: Sequence[HelperStat]) -> float:
    """Per-step cost of helpers on the slowest rank: host time in the helper when the trace has
    the helper's ranges (launch-bound helpers cost host time, not GPU time), else GPU time."""
    per_rank: dict[int, float] = {}
    for s in stats:
        cost = s.host_time_ns if s.host_time_ns else s.gpu_time_ns
        per_rank[s.rank] = per_rank.get(s.rank, 0.0) + cost / max(s.steps, 1) / 1e6
    return max(per_rank.values(), default=0.0)


def real_seqlens(facts: MetadataFacts, workload: Workload) -> list[int] | None:
    if facts.cu_seqlens:
        return [b - a for a, b in zip(facts.cu_seqlens, facts.cu_seqlens[1:], strict=False)]
    return list(workload.seqlens) if workload.seqlens else None


def padding_differences(facts: MetadataFacts) -> list[str] | None:
    """Where padded and unpadded cu_seqlens differ (None when the facts are missing)."""
    pairs = [
        ("cu_seqlens", facts.cu_seqlens, facts.cu_seqlens_padded),
        ("cu_seqlens_kv", facts.cu_seqlens_kv, facts.cu_seqlens_kv_padded),
    ]
    if facts.padded_is_same_object and facts.cu_seqlens:
        return []
    if not (facts.cu_seqlens and facts.cu_seqlens_padded):
        return None
    out = []
    for name, plain, padded in pairs:
        if plain and padded:
            out += [
                f"{name}_padded[{i}]={p} != {name}[{i}]={u}"
                for i, (u, p) in enumerate(zip(plain, padded, strict=False))
                if u != p
            ]
    return out


def saving_from_arms(
    ctx: RuleContext, target: Target, helpers: Sequence[str]
) -> tuple[float, str] | None:
    """Median iteration-time difference to another variant whose group runs none of ``helpers``."""
    mine = ctx.iteration_median(target.group)
    if mine is None:
        return None
    for other in ctx.targets():
        if other.group == target.group or per_step(ctx.stats(other.group, helpers)) > 0:
            continue
        theirs = ctx.iteration_median(other.group)
        if theirs is not None and theirs < mine:
            return mine - theirs, other.label
    return None
