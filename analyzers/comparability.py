"""Before any comparison: may these two runs (window groups) be compared at all?

``comparability(base, head, base_window, head_window)`` checks what the two
sides ran and how they were captured (``RunEnvironment``, filled by ``analyzers.run_identity``)
and returns one typed :class:`~analyzers.report.ComparabilityIssue` per difference:

==================  ===========================================  ====================
aspect              differs when                                 time verdict
==================  ===========================================  ====================
workload            any workload field both sides know, or the   refused
                    job's command (``cptrace profile`` runs)
implementation      the effective ``workload.implementation``     refused
world_size          ``distributedInfo.world_size`` (or ranks)    refused
gpu_model           the device names in the traces                refused
rank_set            the ranks present in the compared windows     warning
versions            torch, Transformer Engine or cuDNN            warning
step_definition     whole trace vs steps, kind of window, steps   warning
                    per window, timeline basis, step counts
profiler            nsys vs Kineto, Kineto with Python stacks     refused when the
                                                                  iteration times are
                                                                  profiled durations
trace_slice         a side's traces are cut short of the run      warning
                    (another run's cut, or whole traces)
==================  ===========================================  ====================

Why refuse: times of another workload, another implementation, another number of GPUs or
another GPU model measure that difference, not the change under review; a gate must answer
"inconclusive" there (``pr_bot.policy`` reads ``refuses_time_verdict``). Version, rank-set,
step and slice differences can explain part of a difference and are said, not refused.

Two arms of one run (the same report on both sides, e.g. ``arm:te_stock`` vs
``arm:te_adapter``) are an experiment by design: the workload fields their variants override
(``VariantWorkload.overrides``) are what is being compared, not a mismatch. A side that does
not record a fact (no manifest, no version) is never a mismatch: nothing is known to differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from analyzers.manifest import Workload
from analyzers.report import (
    AnalysisReport,
    ComparabilityAspect,
    ComparabilityIssue,
    IterationStats,
)
from analyzers.windows import WHOLE_TRACE

Aspect = ComparabilityAspect


def _issue(
    aspect: Aspect, base: object, head: object, message: str, refuses: bool = False
) -> ComparabilityIssue:
    return ComparabilityIssue(
        aspect=aspect,
        base=_text(base),
        head=_text(head),
        message=message,
        refuses_time_verdict=refuses,
    )


def _text(value: object) -> str:
    if isinstance(value, list | tuple | set):
        return ", ".join(str(v) for v in value) or "-"
    return "-" if value is None else str(value)


def _same_run(base: AnalysisReport, head: AnalysisReport) -> bool:
    """Both sides are one run's report (two windows of it): same files, same environment."""
    return base is head or (base.sources == head.sources and base.environment == head.environment)


def effective_workload(report: AnalysisReport, window: str) -> tuple[Workload | None, set[str]]:
    """The workload ``window`` ran (its variant's, else the run's) and the fields its variant
    overrides."""
    for v in report.environment.variants:
        if v.window == window:
            return v.workload, set(v.overrides)
    return report.environment.workload, set()


def _workload_fields(workload: Workload | None) -> dict[str, object]:
    return workload.model_dump(exclude_none=True) if workload is not None else {}


def workload_issues(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[ComparabilityIssue]:
    """Implementation and the other workload fields (both refuse), then the job command."""
    b_work, b_over = effective_workload(base, base_window)
    h_work, h_over = effective_workload(head, head_window)
    declared = b_over | h_over if _same_run(base, head) else set()
    b, h = _workload_fields(b_work), _workload_fields(h_work)
    out = []
    b_impl, h_impl = b.get("implementation"), h.get("implementation")
    if b_impl and h_impl and b_impl != h_impl and "implementation" not in declared:
        out.append(
            _issue(
                Aspect.IMPLEMENTATION,
                b_impl,
                h_impl,
                f"different implementations: base {b_impl}, head {h_impl}: no time verdict "
                "(each side measures its own code)",
                refuses=True,
            )
        )
    differ = sorted(
        k for k in b.keys() & h.keys() if k != "implementation" and k not in declared
        and b[k] != h[k]
    )  # fmt: skip
    if differ:
        shown = "; ".join(f"{k} {b[k]} vs {h[k]}" for k in differ)
        out.append(
            _issue(
                Aspect.WORKLOAD,
                "; ".join(f"{k}={b[k]}" for k in differ),
                "; ".join(f"{k}={h[k]}" for k in differ),
                f"different workloads: {shown}: no time verdict (the times measure the "
                "workload change)",
                refuses=True,
            )
        )
    bc, hc = base.environment.command, head.environment.command
    if bc and hc and bc != hc:
        out.append(
            _issue(
                Aspect.WORKLOAD,
                bc,
                hc,
                f"different job commands: base `{bc}`, head `{hc}`: no time verdict",
                refuses=True,
            )
        )
    return out


def environment_issues(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[ComparabilityIssue]:
    """World size and GPU model (both refuse), the rank set and the library versions."""
    be, he = base.environment, head.environment
    out = []
    if be.world_size and he.world_size and be.world_size != he.world_size:
        out.append(
            _issue(
                Aspect.WORLD_SIZE,
                be.world_size,
                he.world_size,
                f"different world sizes: base {be.world_size}, head {he.world_size}: no time "
                "verdict (the times measure the number of GPUs)",
                refuses=True,
            )
        )
    if be.gpu_models and he.gpu_models and sorted(be.gpu_models) != sorted(he.gpu_models):
        out.append(
            _issue(
                Aspect.GPU_MODEL,
                be.gpu_models,
                he.gpu_models,
                f"different GPU models: base {', '.join(be.gpu_models)}; head "
                f"{', '.join(he.gpu_models)}: no time verdict (the times measure the GPUs)",
                refuses=True,
            )
        )
    b_ranks = sorted({r.rank for r in base.rank_summaries if r.window == base_window})
    h_ranks = sorted({r.rank for r in head.rank_summaries if r.window == head_window})
    if b_ranks != h_ranks:
        out.append(
            _issue(
                Aspect.RANK_SET,
                b_ranks,
                h_ranks,
                f"different rank sets: base {b_ranks}, head {h_ranks}: sums over ranks differ "
                "by the ranks alone; compare the per-rank rows",
            )
        )
    for label, b_version, h_version in (
        ("torch", be.torch, he.torch),
        ("Transformer Engine", be.transformer_engine, he.transformer_engine),
        ("cuDNN", be.cudnn, he.cudnn),
    ):
        if b_version and h_version and b_version != h_version:
            out.append(
                _issue(
                    Aspect.VERSIONS,
                    f"{label} {b_version}",
                    f"{label} {h_version}",
                    f"different {label} versions: base {b_version}, head {h_version}",
                )
            )
    return out


def step_definition(report: AnalysisReport, window: str) -> str:
    """How ``window``'s steps are defined, in words: whole trace, or the kind of window, the
    steps each window holds and the timeline basis (GPU annotation or CPU range). The group's
    name is left out: the two sides' windows are chosen by name (two arms differ by design)."""
    if window == WHOLE_TRACE:
        return "the whole trace"
    windows = [w for w in report.windows if w.group == window]
    kinds = sorted({w.kind for w in windows}) or ["?"]
    steps = sum(r.steps for r in report.rank_summaries if r.window == window)
    per_window = steps / len(windows) if windows else 0
    basis = sorted({t.basis.value for t in report.gpu_timeline if t.window == window})
    kind = "step ranges" if kinds == ["step"] else "annotation windows"
    text = f"{kind}, {per_window:g} step(s) per window"
    return f"{text}, {' + '.join(basis)}" if basis else text


def step_issues(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[ComparabilityIssue]:
    """Whole trace against steps, different step definitions, different step counts."""
    out = []
    b_def, h_def = step_definition(base, base_window), step_definition(head, head_window)
    if (base_window == WHOLE_TRACE) != (head_window == WHOLE_TRACE):
        out.append(
            _issue(
                Aspect.STEP_DEFINITION,
                b_def,
                h_def,
                "one side is the whole trace and the other a step group: totals against "
                "per-step numbers",
            )
        )
    elif b_def != h_def:
        out.append(
            _issue(
                Aspect.STEP_DEFINITION,
                b_def,
                h_def,
                f"different step definitions: base {b_def}; head {h_def}",
            )
        )
    b_steps = {r.steps for r in base.rank_summaries if r.window == base_window}
    h_steps = {r.steps for r in head.rank_summaries if r.window == head_window}
    if b_steps != h_steps:
        out.append(
            _issue(
                Aspect.STEP_DEFINITION,
                sorted(b_steps),
                sorted(h_steps),
                f"different step counts: base {sorted(b_steps)}, head {sorted(h_steps)} "
                "(per-step numbers divide by each side's own)",
            )
        )
    return out


def capture_issues(
    base: AnalysisReport,
    head: AnalysisReport,
    base_window: str,
    head_window: str,
    iterations: tuple[IterationStats | None, IterationStats | None] = (None, None),
) -> list[ComparabilityIssue]:
    """Profiler kinds (refused when the iteration times are profiled durations) and trace
    slices."""
    be, he = base.environment, head.environment
    out = []
    if be.profilers and he.profilers and be.profilers != he.profilers:
        profiled = any(it is not None and it.source == "profiled" for it in iterations)
        out.append(
            _issue(
                Aspect.PROFILER,
                be.profilers,
                he.profilers,
                f"different profilers: base {', '.join(be.profilers)}; head "
                f"{', '.join(he.profilers)}: host times and profiled step durations carry "
                "each profiler's own overhead"
                + (": no time verdict from profiled step durations" if profiled else ""),
                refuses=profiled,
            )
        )
    whole = WHOLE_TRACE in (base_window, head_window)
    cut = bool(be.trace_slices or he.trace_slices) and not _same_run(base, head)
    if cut and (be.trace_slices != he.trace_slices or whole):
        out.append(
            _issue(
                Aspect.TRACE_SLICE,
                be.trace_slices or "the whole run",
                he.trace_slices or "the whole run",
                "traces cut short of the run (base: "
                f"{'; '.join(be.trace_slices) or 'not cut'}; head: "
                f"{'; '.join(he.trace_slices) or 'not cut'}): per-window counts are not "
                "comparable",
            )
        )
    return out


Check = Callable[[AnalysisReport, AnalysisReport, str, str], list[ComparabilityIssue]]
CHECKS: Sequence[Check] = (workload_issues, environment_issues, step_issues)


def comparability(
    base: AnalysisReport,
    head: AnalysisReport,
    base_window: str,
    head_window: str,
    iterations: tuple[IterationStats | None, IterationStats | None] = (None, None),
) -> list[ComparabilityIssue]:
    """Every way the two sides differ that can explain a difference by itself (the module
    docstring lists the aspects and which refuse a time verdict).

    ``iterations``: the base and head iteration statistics the time verdict would use.
    """
    out = [issue for check in CHECKS for issue in check(base, head, base_window, head_window)]
    return out + capture_issues(base, head, base_window, head_window, iterations)


def refusal(issues: Sequence[ComparabilityIssue]) -> str | None:
    """Why no time verdict may be drawn (the refusing issues' aspects), None when one may."""
    refusing = [i.aspect.value.replace("_", " ") for i in issues if i.refuses_time_verdict]
    return f"different {', '.join(dict.fromkeys(refusing))}" if refusing else None


__all__ = [
    "CHECKS",
    "capture_issues",
    "comparability",
    "effective_workload",
    "environment_issues",
    "refusal",
    "step_definition",
    "step_issues",
    "workload_issues",
]
