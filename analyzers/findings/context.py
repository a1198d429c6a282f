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
from analyzers.report import (
    Category,
    Evidence,
    HelperHostTime,
    HelperStat,
    HostTimeReport,
    IterationStats,
)
from analyzers.windows import WHOLE_TRACE

NOT_OBSERVED = "not observed: no GPU activity in this trace"
"""What a rule says about a figure that needs GPU evidence, on a trace without any (a CPU run,
a CPU-only profile, an nsys export without CUPTI tables), instead of staying silent."""


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
    host_time: HostTimeReport | None = None
    """Host time per helper from the ranges (``analyzers.host_time``): what the rules judge
    from when the trace has no GPU activity."""

    @property
    def gpu_observed(self) -> bool:
        """Whether the trace has GPU activity (without a host-time report: assumed, as the
        GPU metrics are all the rules get)."""
        return self.host_time is None or self.host_time.gpu_activity

    def host_rows(self, group: str, helpers: Sequence[str]) -> list[HelperHostTime]:
        rows = self.host_time.helpers if self.host_time else []
        return [h for h in rows if h.window == group and h.helper in helpers and h.calls]

    def ran(self, group: str, helpers: Sequence[str]) -> bool:
        """Whether any of ``helpers`` ran in the group: GPU activities when the trace has GPU
        activity, else host calls (catalogued ranges; a CPU run still records them)."""
        if self.gpu_observed:
            return per_step(self.stats(group, helpers)) > 0
        return bool(self.host_rows(group, helpers))

    def category_ran(self, group: str, category: Category) -> bool:
        """Whether helpers of a category ran in the group (GPU activities, else host calls)."""
        if self.gpu_observed:
            return self.category_launches(group, category) > 0
        rows = self.host_time.helpers if self.host_time else []
        return any(h.window == group and h.category == category and h.calls for h in rows)

    def ranks_running(self, group: str, helpers: Sequence[str]) -> list[int]:
        rows: Sequence[HelperStat | HelperHostTime] = (
            self.stats(group, helpers) if self.gpu_observed else self.host_rows(group, helpers)
        )
        return sorted({r.rank for r in rows})

    def names_running(self, group: str, helpers: Sequence[str]) -> str:
        rows: Sequence[HelperStat | HelperHostTime] = (
            self.stats(group, helpers) if self.gpu_observed else self.host_rows(group, helpers)
        )
        return ", ".join(sorted({r.helper for r in rows}))

    def usage_evidence(self, group: str, helpers: Sequence[str]) -> list[Evidence]:
        """How much the helpers ran: GPU figures (:func:`helper_evidence`) when the trace has
        GPU activity, else host figures from the ranges (:func:`host_evidence`)."""
        if self.gpu_observed:
            return helper_evidence(self.stats(group, helpers), group)
        return host_evidence(self.host_rows(group, helpers), group)

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


def per_step_basis(group: str, steps: int) -> tuple[int, str]:
    """How a group's totals become evidence: ``(divisor, wording)``.

    A step group's totals are divided by its step count and the name says so ("per step (total
    / 3 steps)"); the whole trace is not a step, so its totals stay totals ("in the whole
    trace") and never read as per step.
    """
    if group == WHOLE_TRACE:
        return 1, "in the whole trace"
    n = max(steps, 1)
    return n, f"per step (total / {n} step{'s' if n != 1 else ''})"


def _first_call_evidence(first_ns: int, rank: int, group: str) -> Evidence:
    """The first call's host time on its own: compilation and warm-up, kept apart from the
    steady state (GPU and CPU-only traces alike)."""
    return Evidence(
        name="host time of the first call alone (compilation, warm-up)",
        value=round(first_ns / 1e6, 4),
        unit="ms",
        rank=rank,
        window=group,
    )


def helper_evidence(stats: Sequence[HelperStat], group: str) -> list[Evidence]:
    """Per rank: CPU launch calls, GPU time and host time of some helpers, per step in a step
    group and as totals in the whole trace; the first call's host time (a compiled helper
    compiles on it) is reported apart from the steady state."""
    by_rank: dict[int, list[HelperStat]] = {}
    for s in stats:
        by_rank.setdefault(s.rank, []).append(s)
    out = []
    for rank, rows in sorted(by_rank.items()):
        steps, basis = per_step_basis(group, rows[0].steps)
        names = ", ".join(sorted({r.helper for r in rows}))
        first = sum(r.first_call_host_ns for r in rows)
        out += [
            Evidence(
                name=f"CPU launch calls {basis} ({names})",
                value=round(sum(r.launches for r in rows) / steps, 2),
                rank=rank,
                window=group,
            ),
            Evidence(
                name=f"GPU activities {basis}",
                value=round(sum(r.activities for r in rows) / steps, 2),
                rank=rank,
                window=group,
            ),
            Evidence(
                name=f"GPU time {basis}",
                value=round(sum(r.gpu_time_ns for r in rows) / steps / 1e6, 4),
                unit="ms",
                rank=rank,
                window=group,
            ),
            Evidence(
                name=f"host time in the helper {basis}"
                + (", first call excluded" if first else ""),
                value=round((sum(r.host_time_ns for r in rows) - first) / steps / 1e6, 4),
                unit="ms",
                rank=rank,
                window=group,
            ),
        ]
        if first:
            out.append(_first_call_evidence(first, rank, group))
    return out


def host_evidence(rows: Sequence[HelperHostTime], group: str) -> list[Evidence]:
    """Per rank, from the host ranges alone (a trace without GPU activity): calls, host time
    (steady state: the first call, compilation or warm-up, reported apart), host time per call
    and the host-sync operators inside the calls; the GPU figures are stated as not observed."""
    by_rank: dict[int, list[HelperHostTime]] = {}
    for r in rows:
        by_rank.setdefault(r.rank, []).append(r)
    out = []
    for rank, mine in sorted(by_rank.items()):
        steps, basis = per_step_basis(group, mine[0].steps)
        names = ", ".join(sorted({r.helper for r in mine}))
        calls = sum(r.calls for r in mine)
        first = sum(r.first_call_ns for r in mine)
        firsts = sum(1 for r in mine if r.first_call_ns)
        steady = sum(r.inclusive_ns for r in mine) - first
        excluded = ", first call excluded" if first else ""
        out += [
            Evidence(
                name=f"calls {basis} (host ranges; {names})",
                value=round(calls / steps, 2),
                rank=rank,
                window=group,
            ),
            Evidence(
                name=f"host time in the helper {basis}{excluded}",
                value=round(steady / steps / 1e6, 4),
                unit="ms",
                rank=rank,
                window=group,
            ),
        ]
        if calls > firsts:
            out.append(
                Evidence(
                    name=f"host time per call{excluded}",
                    value=round(steady / (calls - firsts) / 1e6, 4),
                    unit="ms",
                    rank=rank,
                    window=group,
                )
            )
        out.append(
            Evidence(
                name=f"host-sync operators inside the calls {basis}",
                value=round(sum(r.sync_ops for r in mine) / steps, 2),
                rank=rank,
                window=group,
            )
        )
        if first:
            out.append(_first_call_evidence(first, rank, group))
    out.append(
        Evidence(
            name="CPU launch calls, GPU activities and GPU time of the helper",
            value=NOT_OBSERVED,
            window=group,
        )
    )
    return out


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


LAUNCH_HOST_COST_US = 10.0
"""Host cost of one eager launch (Python + ATen dispatch + ``cudaLaunchKernel``), in µs.

Why a constant and not the trace's host time: host time inside a helper's ranges is measured
under the profiler, and with ``with_stack=True`` (Python frames recorded) it is inflated
several-fold (TE 2.20.2 reference bundle: 2.7-4.7 ms/step inside the zero-fill helper, whose
removal saves about 1.6 ms). The value comes from timed runs without a profiler on 2x H200:
removing TE 2.20.2's THD zero-fill (92 launches, 0.72 ms GPU per iteration) saved
21.28 - 19.67 = 1.61 ms (DESIGN.md problem 1), i.e. (1.61 - 0.72) / 92 = 9.7 µs per launch; the
bundled implementation's forced zero-fill (112 launches, 0.69 ms GPU) costs 2.78 ms in the
``bundled-fixed-vs-broken`` demo bundle, 18.6 µs per launch. 10 µs is the low end.
"""


@dataclass(slots=True)
class Saving:
    """An expected saving per iteration and how it was obtained."""

    ms: float | None  # None: whole-trace totals (not per iteration), or no GPU activity
    basis: str | None  # "measured" | "estimate"; None without GPU activity
    evidence: list[Evidence]
    pct: float | None = None


def timed_stats(ctx: RuleContext, group: str) -> IterationStats | None:
    """All-ranks timed (CUDA-event, no profiler) iterations of a group, if the manifest has them."""
    for it in ctx.iterations:
        if it.label == group and it.rank is None and it.source == "timed":
            return it
    return None


def arm_iteration_ms(ctx: RuleContext, group: str) -> tuple[float, str] | None:
    """Median iteration time of a group and where it comes from (timed, else profiled)."""
    timed = timed_stats(ctx, group)
    if timed is not None:
        return timed.median_ms, "timed"
    median = ctx.iteration_median(group)
    return None if median is None else (median, "profiled")


def _signature(ctx: RuleContext, group: str, exclude: Sequence[str]) -> frozenset[str]:
    """Finding-feeding helpers that run in a group, except ``exclude``: two arms with the same
    signature differ (as far as the catalog can tell) only in ``exclude``."""
    names = [h.name for h in ctx.catalog.helpers if h.finding and h.name not in exclude]
    return frozenset(n for n in names if ctx.ran(group, [n]))


def saving_from_arms(
    ctx: RuleContext, target: Target, helpers: Sequence[str]
) -> tuple[float, str, IterationStats, IterationStats] | None:
    """Measured median difference to a timed arm that runs none of ``helpers`` and the same
    other finding helpers (so the difference is the helpers' cost, not another fix's).

    Of several such arms the smallest difference wins (the conservative claim). Returns
    ``(mine - theirs, their label, my stats, their stats)``; the difference may be negative.
    """
    mine = timed_stats(ctx, target.group)
    if mine is None:
        return None
    signature = _signature(ctx, target.group, helpers)
    best = None
    seen = {target.group}
    for other in ctx.targets():
        if other.group in seen:
            continue
        seen.add(other.group)
        theirs = timed_stats(ctx, other.group)
        if theirs is None or ctx.ran(other.group, helpers):
            continue
        if _signature(ctx, other.group, helpers) != signature:
            continue
        diff = mine.median_ms - theirs.median_ms
        if best is None or diff < best[0]:
            best = (diff, other.label, mine, theirs)
    return best


def estimated_cost_ms(stats: Sequence[HelperStat]) -> tuple[float, int, float, float]:
    """Estimate per step on the slowest rank: GPU time + CPU launch calls x LAUNCH_HOST_COST_US
    (in the whole trace, where steps is 1, the same sum over the whole trace).

    Returns ``(estimate ms, rank, GPU ms, launches)``. The helpers' kernels run on the compute
    stream in series with attention, so their GPU time is on the critical path; the launches
    cost host time when the step is launch-bound. Summing both is an upper-side estimate.
    """
    per_rank: dict[int, list[float]] = {}
    for s in stats:
        steps = max(s.steps, 1)
        row = per_rank.setdefault(s.rank, [0.0, 0.0])
        row[0] += s.gpu_time_ns / steps / 1e6
        row[1] += s.launches / steps
    best = (0.0, -1, 0.0, 0.0)
    for rank, (gpu, launches) in sorted(per_rank.items()):
        cost = gpu + launches * LAUNCH_HOST_COST_US / 1000.0
        if cost > best[0]:
            best = (cost, rank, gpu, launches)
    return best


def expected_saving(ctx: RuleContext, target: Target, helpers: Sequence[str]) -> Saving:
    """The saving of removing ``helpers`` from a group, honestly sourced.

    (a) a timed arm of the same run without the helpers: the measured median difference;
    (b) otherwise an estimate from GPU time and launch count (never from profiled host time);
    (c) never more than the arm's own measured iteration time.
    """
    ms: float | None
    evidence: list[Evidence] = []
    arm = saving_from_arms(ctx, target, helpers)
    if not ctx.gpu_observed:
        return _saving_not_observed(target, arm)
    if arm is not None and arm[0] > 0:
        diff, label, mine, theirs = arm
        ms, basis = diff, "measured"
        evidence += [
            Evidence(
                name=f"median iteration difference to arm {label!r}",
                value=round(diff, 3),
                unit="ms",
                window=target.group,
            ),
            Evidence(
                name="saving basis",
                value=(
                    f"measured: median of timed iterations (CUDA events, no profiler), "
                    f"{target.label!r} {mine.median_ms:.3f} ms (n={mine.n}) - {label!r} "
                    f"{theirs.median_ms:.3f} ms (n={theirs.n}), an arm of this run without "
                    f"{', '.join(helpers)}"
                ),
                window=target.group,
            ),
        ]
    else:
        total, rank, gpu, launches = estimated_cost_ms(ctx.stats(target.group, helpers))
        basis = "estimate"
        whole = target.group == WHOLE_TRACE
        # whole-trace totals are not per iteration: no per-iteration saving can be claimed
        ms = None if whole else total
        per = "in the whole trace, not per iteration" if whole else "per step"
        if arm is not None:
            evidence.append(
                Evidence(
                    name=f"median iteration difference to arm {arm[1]!r}",
                    value=round(arm[0], 3),
                    unit="ms",
                    window=target.group,
                )
            )
        evidence.append(
            Evidence(
                name="saving basis",
                value=(
                    f"estimate: GPU time {gpu:.3f} ms + {launches:g} CPU launch calls x "
                    f"{LAUNCH_HOST_COST_US:g} us per launch (rank {rank}, {per}); host time "
                    f"under the profiler is not used (Python stacks inflate it)"
                    + (
                        f"; the timed arm {arm[1]!r} without the helper is not faster, so the "
                        f"difference there comes from something else"
                        if arm is not None
                        else ""
                    )
                ),
                window=target.group,
            )
        )
    iteration = arm_iteration_ms(ctx, target.group)
    if ms is not None and iteration is not None and ms > iteration[0]:
        ms = iteration[0]
        evidence.append(
            Evidence(
                name=f"capped at the arm's {iteration[1]} median iteration time",
                value=round(iteration[0], 3),
                unit="ms",
                window=target.group,
            )
        )
    timed = timed_stats(ctx, target.group)
    pct = 100.0 * ms / timed.median_ms if ms is not None and timed and timed.median_ms else None
    return Saving(ms=ms, basis=basis, evidence=evidence, pct=pct)


def _saving_not_observed(
    target: Target, arm: tuple[float, str, IterationStats, IterationStats] | None
) -> Saving:
    """No GPU activity: no saving is claimed. The estimate needs the helper's GPU time and
    launches, and a run without GPU (gloo on CPU) times CPU work that does not carry over to a
    GPU; a sibling arm's measured difference is shown for what it is."""
    evidence = [
        Evidence(
            name="expected saving",
            value=f"{NOT_OBSERVED} (the estimate needs the helper's GPU time and launches; "
            "iteration times of a run without GPU do not carry over to a GPU)",
            window=target.group,
        )
    ]
    if arm is not None:
        diff, label, mine, theirs = arm
        evidence.append(
            Evidence(
                name=f"median iteration difference to arm {label!r} (timed iterations of this "
                f"run without GPU, n={mine.n} and {theirs.n}; not a GPU saving)",
                value=round(diff, 3),
                unit="ms",
                window=target.group,
            )
        )
    return Saving(ms=None, basis=None, evidence=evidence)
