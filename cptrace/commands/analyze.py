"""``cptrace analyze``, ``cptrace compare`` and ``cptrace catalog``: thin wrappers over analyzers.

Library errors (bad trace, manifest, catalog, window name, regex) become ``ClickException``s
here and nowhere else. Rich is imported lazily so ``cptrace --help`` stays fast.
"""

from __future__ import annotations

import json
import re
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from cptrace.commands._account_tables import render_account, render_account_delta
from cptrace.commands._numpy import import_numpy


class Section(StrEnum):
    """A part of ``analyze``'s text report (``--report``); the sources, a failure, the "do this
    first" actions and the notes are always printed."""

    FINDINGS = "findings"
    SUMMARY = "summary"
    HELPERS = "helpers"
    RANKS = "ranks"
    TIMELINE = "timeline"
    ACCOUNT = "account"
    DEVICES = "devices"
    KERNELS = "kernels"
    HOST = "host"
    ITERATIONS = "iterations"


ALL_SECTIONS = frozenset(Section)


class OutputFormat(StrEnum):
    """``analyze --format``: rich tables, one CSV (a row per table row) or the report's JSON."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"


TOP_HELPERS = 15
TOP_KERNELS = 15


def _library_errors() -> tuple[type[BaseException], ...]:
    from analyzers.catalog import CatalogError
    from analyzers.compare import CompareError
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError

    return (TraceError, ManifestError, CatalogError, CompareError, re.error, OSError)


def _fail(exc: BaseException) -> typer.Exit:
    """Print a library error the way Click prints a ``ClickException`` and exit with status 1.

    (The installed Typer vendors its own Click, so ``click.ClickException`` raised here would not
    be recognised as a usage error and would surface as a traceback.)
    """
    typer.echo(f"Error: {exc}", err=True)
    return typer.Exit(code=1)


def _catalog(extra: list[Path] | None) -> Any:
    from analyzers.catalog import load_catalog

    return load_catalog(extra or ())


def _run_analyze(
    paths: list[Path],
    manifest: Path | None,
    step_pattern: str | None,
    catalog: list[Path] | None,
    show_progress: bool,
    rank: int | None = None,
) -> Any:
    from analyzers import analyze as run

    if step_pattern:
        re.compile(step_pattern)  # fail before reading gigabytes
    cat = _catalog(catalog)
    if not show_progress or not sys.stderr.isatty():
        return run(paths, manifest=manifest, step_pattern=step_pattern, catalog=cat, rank=rank)
    from cptrace.commands._progress import LateProgress

    with LateProgress() as update:
        return run(
            paths,
            manifest=manifest,
            step_pattern=step_pattern,
            catalog=cat,
            progress=update,
            rank=rank,
        )


def _load_side(
    paths: list[Path], manifest: Path | None, step_pattern: str | None, catalog: list[Path] | None
) -> Any:
    """A saved report (``analyze --json`` output, recognised by content) or traces/bundles to
    analyze now; ``analyzers.analyze`` tells them apart (one sniffer)."""
    return _run_analyze(paths, manifest, step_pattern, catalog, show_progress=False)


def analyze(
    traces: list[Path] = typer.Argument(
        ..., help="Trace files (Kineto JSON per rank, nsys .sqlite[.gz]/.nsys-rep) or run bundles."
    ),
    manifest: Path | None = typer.Option(
        None, "--manifest", "-m", help="Run manifest JSON (facts a trace cannot show)."
    ),
    step_pattern: str | None = typer.Option(
        None, "--step-pattern", help="Regex for step range names (default ProfilerStep#N)."
    ),
    catalog: list[Path] | None = typer.Option(
        None, "--catalog", help="Extra helper catalog TOML (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    rank: int | None = typer.Option(
        None,
        "--rank",
        help="Rank of a single trace file that does not say its own (default: rank 0, noted).",
    ),
    report_sections: list[Section] | None = typer.Option(
        None,
        "--report",
        help="Print only these sections of the text report (repeatable; default all). The "
        "per-window sections (helpers, ranks, timeline, account) are most of its length.",
    ),
    output_format: OutputFormat = typer.Option(
        OutputFormat.TABLE, "--format", help="table, csv (one row per table row) or json."
    ),
    full: bool = typer.Option(
        False, "--full", help="JSON: keep the timelines (left out by default: they are large)."
    ),
) -> None:
    """Attribute every kernel to a CP helper, measure each step, and report findings.

    The bundle of a job that failed or hung leads with the failure: which rank raised what
    where, or where each rank was waiting (its stack), and the log's tail (--json: the
    "failure" key first; a bundle without traces exits 1 with {failure_headline, failure,
    findings}).

    --report SECTION (repeatable) prints only those sections of the text report, in its order:
    helpers, ranks, timeline, account (one table each per window), devices, kernels, summary,
    host, iterations, findings; the sources, a failure, the "do this first" actions and the
    notes always.

    --format table|csv|json: csv is one row per table row of the sections, with ``section``
    and ``table`` columns; json (also --json) leaves out the timelines (--full keeps them) and,
    with --report, keeps only those sections' keys. Sources in a bundle are named by bundle and
    member (``run.tar.gz:traces/rank0.json.gz``). An analysis over a second shows a progress
    bar on stderr when it is a terminal.

    Example: cptrace analyze rank0.json.gz rank1.json.gz --step-pattern '^arm:' --manifest run.json
    """
    import_numpy()
    from analyzers.pipeline import FailedRunError

    as_json = as_json or output_format is OutputFormat.JSON
    try:
        report = _run_analyze(traces, manifest, step_pattern, catalog, True, rank=rank)
    except FailedRunError as exc:
        # the bundle of a job that failed: the one-line error, how it failed, what the manifest
        # shows
        failed = _fail(exc)
        _render_manifest_findings(exc.failure, exc.findings, as_json)
        raise failed from exc
    except _library_errors() as exc:
        raise _fail(exc) from exc
    if as_json or output_format is OutputFormat.CSV:
        from cptrace.commands._report_output import report_csv, report_json

        if as_json:
            typer.echo(json.dumps(report_json(report, report_sections, full=full), indent=2))
        else:
            typer.echo(report_csv(report, report_sections), nl=False)
        return
    render_report(report, frozenset(report_sections) if report_sections else ALL_SECTIONS)


def _render_manifest_findings(failure: Any, findings: list[Any], as_json: bool) -> None:
    """A failed run's failure and the findings of its manifest alone (``--json``: one object,
    ``{failure_headline, failure, findings}``, on stdout)."""
    from analyzers.failure import failure_headline

    if as_json:
        payload = {
            "failure_headline": failure_headline(failure) if failure is not None else None,
            "failure": failure.model_dump(mode="json") if failure is not None else None,
            "findings": [f.model_dump(mode="json") for f in findings],
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    console = _console()
    if failure is not None:
        render_failure(console, failure)
    if findings:
        _render_findings(console, findings, "Findings from the run manifest (no trace)")


FAILURE_LOG_LINES = 20
"""Lines of the job's log tail ``cptrace analyze`` prints (the bundle has the whole tail)."""


def render_failure(console: Any, failure: Any) -> None:
    """How the job failed, first: the headline, each rank's stack, the log tail."""
    from rich.markup import escape

    from analyzers.failure import failure_headline, rank_stacks

    console.print(
        f"[bold red]FAILED[/] the job failed: {escape(failure_headline(failure))}",
        highlight=False,
        soft_wrap=True,  # one line, greppable in CI logs
    )
    for stack in rank_stacks(failure):
        where = f": waiting at {stack.waiting_at.where()}" if stack.waiting_at else ""
        console.print(
            f"[bold]rank {escape(stack.rank)} stack{escape(where)}[/]",
            highlight=False,
            soft_wrap=True,
        )
        console.print(escape(stack.text.rstrip()), highlight=False)
    if failure.log_tail:
        tail = failure.log_tail[-FAILURE_LOG_LINES:]
        console.print(f"[bold]log tail[/] (last {len(tail)} of {len(failure.log_tail)} lines):")
        console.print(escape("\n".join(tail)), highlight=False)


def compare(
    base: list[Path] = typer.Option(
        ..., "--base", help="Base traces/bundle, or a saved report JSON (repeat for several files)."
    ),
    head: list[Path] | None = typer.Option(
        None,
        "--head",
        help="Head traces/bundle/report (default: the base, to compare two windows).",
    ),
    base_window: str | None = typer.Option(
        None, "--base-window", help="Window group of the base (e.g. arm:auto_clone)."
    ),
    head_window: str | None = typer.Option(None, "--head-window", help="Window group of the head."),
    manifest: Path | None = typer.Option(None, "--manifest", "-m", help="Manifest for both sides."),
    base_manifest: Path | None = typer.Option(
        None, "--base-manifest", help="Manifest for the base only."
    ),
    head_manifest: Path | None = typer.Option(
        None, "--head-manifest", help="Manifest for the head only."
    ),
    step_pattern: str | None = typer.Option(
        None, "--step-pattern", help="Regex for step range names."
    ),
    catalog: list[Path] | None = typer.Option(
        None, "--catalog", help="Extra helper catalog TOML (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the ComparisonReport as JSON."),
) -> None:
    """Compare base and head: per-helper launch and time deltas, iteration statistics, findings.

    First the comparability check: one ``warning:`` line per way the sides differ, with its
    aspect (workload, implementation, world_size, gpu_model, rank_set, versions,
    step_definition, profiler, trace_slice); another workload, implementation, world size or
    GPU model refuses the time verdict ("inconclusive"). ``--json``: ``comparability``.

    When a side has no GPU activity (a CPU run), per-helper host time from the ranges instead
    (``--json``: the ComparisonReport plus ``host_rows``, null when both sides ran on a GPU).

    Example: cptrace compare --base run.json --base-window arm:auto_clone --head-window arm:fast
    """
    import_numpy()
    from analyzers import compare_reports
    from pr_bot.deltas import host_rows_for

    try:
        base_report = _load_side(base, base_manifest or manifest, step_pattern, catalog)
        head_report = (
            base_report
            if not head
            else _load_side(head, head_manifest or manifest, step_pattern, catalog)
        )
        result = compare_reports(
            base_report, head_report, base_window=base_window, head_window=head_window
        )
    except _library_errors() as exc:
        raise _fail(exc) from exc
    host_rows = host_rows_for(base_report, head_report, result)  # the PR comment's rows too
    if as_json:
        # the report's own serialisation (non-finite floats as null), plus the host rows
        payload = json.loads(result.model_dump_json())
        payload["host_rows"] = (
            None if host_rows is None else [r.model_dump(mode="json") for r in host_rows]
        )
        typer.echo(json.dumps(payload, indent=2))
        return
    render_comparison(result, host_rows)


def catalog(
    extra: list[Path] | None = typer.Option(
        None, "--catalog", help="Extra helper catalog TOML (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the catalog as JSON."),
) -> None:
    """Print the helper catalog: each helper's category, patterns and the finding it feeds.

    Example: cptrace catalog --catalog my_helpers.toml
    """
    try:
        cat = _catalog(extra)
    except _library_errors() as exc:
        raise _fail(exc) from exc
    if as_json:
        from analyzers.catalog.description import describe

        typer.echo(describe(cat).model_dump_json(indent=2))
        return
    render_catalog(cat)


# ---------------------------------------------------------------------------- rendering (rich)

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _console() -> Any:
    from rich.console import Console

    # Piped output (CI logs, files) gets a wide fixed width instead of rich's 80-column default,
    # so helper names and findings stay greppable on one line.
    return Console(width=None if sys.stdout.isatty() else 200)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _per(group: str) -> tuple[str, str]:
    """(title wording, column unit) of a group's numbers: per step, or whole-trace totals."""
    if group == "whole trace":
        return "totals over the whole trace", ""
    return "per step (total / steps)", "/step"


def render_report(report: Any, sections: frozenset[Section] = ALL_SECTIONS) -> None:
    """Sources, the "do this first" actions (always), findings and the summary, then the
    per-group helper, rank and GPU-timeline tables, the whole-trace reference figures (devices,
    kernels), host time and iterations; of those, only ``sections``."""
    from cptrace.commands._summary_tables import render_do_first, render_summary

    console = _console()
    if report.failure is not None:  # the traces cover only what ran before the failure
        render_failure(console, report.failure)
    console.print(
        f"[bold]cptrace analysis[/] catalog {report.catalog_version}, ranks {report.ranks}"
    )
    for src in report.sources:
        console.print(
            f"  {src.path} ({src.format}, ranks {src.ranks}): {src.activities} GPU activities, "
            f"{src.launches} CPU launch calls, {src.ranges} ranges"
        )
    render_do_first(console, report.summary)
    # What to do and why first; the tables that back it up follow.
    if Section.FINDINGS in sections:
        _render_findings(console, report.findings, "Findings")
    if Section.SUMMARY in sections:
        render_summary(console, report.summary)
    for group in report.groups:
        if Section.HELPERS in sections:
            _render_helpers(console, report, group)
        if Section.RANKS in sections:
            _render_ranks(console, report, group)
        if _cpu_only(report):  # no GPU: its timeline and account would be all "idle"
            if sections & {Section.TIMELINE, Section.ACCOUNT}:
                console.print(
                    f"{group}: GPU timeline and where the step went: not observed: no GPU "
                    "activity in this trace",
                    highlight=False,
                )
            continue
        if Section.TIMELINE in sections:
            _render_timeline(console, [t for t in report.gpu_timeline if t.window == group], group)
        if Section.ACCOUNT in sections:
            render_account(console, report, group)
    if Section.DEVICES in sections:
        _render_devices(console, report.devices)
    if Section.KERNELS in sections:
        _render_kernels(console, [k for k in report.kernels if k.window == "whole trace"])
    if Section.HOST in sections:
        _render_host_time(console, report)
    if Section.ITERATIONS in sections:
        _render_iterations(console, report.iterations)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]")


def _render_helpers(console: Any, report: Any, group: str) -> None:
    from cptrace.commands._tables import TextTable

    per, unit = _per(group)
    rows = [h for h in report.helpers if h.window == group]
    table = TextTable(title=f"{group}: helpers, {per}")
    for col in (
        "rank",
        "helper",
        "category",
        f"launches{unit}",
        f"activities{unit}",
        f"GPU ms{unit}",
        f"host ms{unit}",
        "first call ms",
        "matched by",
    ):
        table.add_column(
            col, justify="left" if col in ("helper", "category", "matched by") else "right"
        )
    for h in sorted(rows, key=lambda h: (h.rank, -h.gpu_time_ns))[
        : TOP_HELPERS * max(1, len(report.ranks))
    ]:
        steps = 1 if group == "whole trace" else max(h.steps, 1)
        table.add_row(
            str(h.rank),
            h.helper,
            h.category.value,
            f"{h.launches / steps:g}",
            f"{h.activities / steps:g}",
            _ms(h.gpu_time_ns / steps),
            _ms((h.host_time_ns - h.first_call_host_ns) / steps),
            _ms(h.first_call_host_ns) if h.first_call_host_ns else "-",
            h.matched_by,
        )
    if rows or not _cpu_only(report):  # a CPU-only trace gets its host-time tables instead
        console.print(table)
        console.print(
            "[dim]launches = CPU launch calls, activities = kernels + memcpy + memset; host ms "
            "excludes the first call (compilation, warm-up), shown apart[/]"
        )


def _render_ranks(console: Any, report: Any, group: str) -> None:
    from cptrace.commands._tables import TextTable

    per, unit = _per(group)
    totals = TextTable(title=f"{group}: ranks, {per}")
    for col in (
        "rank",
        "steps",
        f"span ms{unit}",
        f"kernels{unit}",
        f"launches{unit}",
        f"activities{unit}",
        "attributed",
    ):
        totals.add_column(col, justify="right")
    for r in (r for r in report.rank_summaries if r.window == group):
        steps = 1 if group == "whole trace" else max(r.steps, 1)
        totals.add_row(
            str(r.rank),
            "-" if group == "whole trace" else str(r.steps),
            _ms(r.span_ns / steps),
            f"{r.kernels / steps:g}",
            f"{r.launches / steps:g}",
            f"{r.activities / steps:g}",
            f"{r.attributed_fraction:.1%}",
        )
    console.print(totals)


def _cpu_only(report: Any) -> bool:
    return report.host_time is not None and not report.host_time.gpu_activity


def _render_host_time(console: Any, report: Any) -> None:
    """Host time per helper from the ranges: shown when the trace has no GPU activity (then the
    GPU tables are empty and these are the figures there are)."""
    from cptrace.commands._tables import TextTable

    host = report.host_time
    if host is None or host.gpu_activity or not host.helpers:
        return
    for group in report.groups:
        rows = [h for h in host.helpers if h.window == group]
        if not rows:
            continue
        whole = group == "whole trace"
        unit = "" if whole else "/step"
        title = f"{group}: host time per helper from the ranges (no GPU activity), " + (
            "totals over the trace" if whole else "per step (totals / steps)"
        )
        table = TextTable(title=title)
        for col in ("rank", "helper", "category", f"calls{unit}", f"inclusive ms{unit}"):
            table.add_column(col, justify="left" if col in ("helper", "category") else "right")
        for col in (f"self ms{unit}", "first call ms", f"sync ops{unit}"):
            table.add_column(col, justify="right")
        for h in sorted(rows, key=lambda h: (h.rank, -h.inclusive_ns)):
            steps = 1 if whole else max(h.steps, 1)
            table.add_row(
                str(h.rank),
                h.helper,
                h.category.value,
                f"{h.calls / steps:g}",
                _ms(h.inclusive_ns / steps),
                _ms(h.self_ns / steps),
                _ms(h.first_call_ns) if h.first_call_ns else "-",
                f"{h.sync_ops / steps:g}",
            )
        console.print(table)
        console.print(
            "[dim]inclusive and self include the first call (compilation, warm-up), shown "
            "apart; sync ops = host-sync operators (aten::item, ...) inside the calls[/]"
        )


def _render_timeline(console: Any, rows: list[Any], group: str) -> None:
    """The clipped GPU timeline: computation + exposed communication + exposed memcpy = busy;
    busy + idle = total (the window)."""
    from cptrace.commands._tables import TextTable

    if not rows:
        return
    per, unit = _per(group)
    table = TextTable(
        title=f"{group}: GPU timeline (clipped to the windows), {per}",
    )
    for col in (
        "rank",
        "window",
        f"total ms{unit}",
        "computation",
        "exposed comm",
        "exposed memcpy",
        "busy",
        "idle",
    ):
        table.add_column(col, justify="left" if col == "window" else "right")
    for t in sorted(rows, key=lambda t: t.rank):
        steps = 1 if group == "whole trace" else max(t.steps, 1)
        table.add_row(
            str(t.rank),
            t.basis.value,
            _ms(t.total_ns / steps),
            _ms(t.computation_ns / steps),
            _ms(t.exposed_communication_ns / steps),
            _ms(t.exposed_memcpy_ns / steps),
            _ms(t.busy_ns / steps),
            _ms(t.idle_ns / steps),
        )
    console.print(table)


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _render_devices(console: Any, devices: list[Any]) -> None:
    from cptrace.commands._tables import TextTable

    if not devices:
        return
    table = TextTable(title="GPU devices, totals over the whole trace")
    for col in (
        "rank",
        "device",
        "kernels",
        "kernel ms",
        "kernel span ms",
        "with launch",
        "without launch",
        "memcpy",
        "memcpy ms",
        "memcpy bytes",
        "memset",
        "memset ms",
        "memset bytes",
        "total GPU ms",
    ):
        table.add_column(col, justify="right")
    for d in devices:
        table.add_row(
            str(d.rank),
            str(d.device),
            str(d.kernels),
            _ms(d.kernel_time_ns),
            _ms(d.kernel_span_ns),
            str(d.kernels_with_launch),
            str(d.kernels_without_launch),
            str(d.memcpy),
            _ms(d.memcpy_time_ns),
            _bytes(d.memcpy_bytes)
            + (f" (+{d.memcpy_bytes_unknown} unknown)" if d.memcpy_bytes_unknown else ""),
            str(d.memset),
            _ms(d.memset_time_ns),
            _bytes(d.memset_bytes)
            + (f" (+{d.memset_bytes_unknown} unknown)" if d.memset_bytes_unknown else ""),
            _ms(d.gpu_time_ns),
        )
    console.print(table)
    console.print(
        "[dim]total GPU = kernel + memcpy + memset time (summed durations, not a union)[/]"
    )


def _render_kernels(console: Any, rows: list[Any]) -> None:
    """The top of the per-kernel-name table over all ranks (``--json`` has every row and rank)."""
    from rich.markup import escape

    from cptrace.commands._tables import TextTable

    pooled = [k for k in rows if k.rank is None]
    if not pooled:
        return
    table = TextTable(
        title=f"Kernels, whole trace, all ranks (top {min(TOP_KERNELS, len(pooled))} of "
        f"{len(pooled)} names by total time; ns)",
    )
    for col in ("time %", "total", "count", "average", "median", "min", "max", "stddev"):
        table.add_column(col, justify="right")
    # Kernel names differ late (template arguments, tile sizes): wrap them, never cut them.
    table.add_column("name", justify="left", overflow="fold")
    for k in sorted(pooled, key=lambda k: -k.total_ns)[:TOP_KERNELS]:
        table.add_row(
            f"{k.time_pct:.1f}",
            str(k.total_ns),
            str(k.count),
            f"{k.average_ns:.1f}",
            f"{k.median_ns:.1f}",
            str(k.min_ns),
            str(k.max_ns),
            f"{k.stddev_ns:.1f}",
            escape(k.name),
        )
    console.print(table)


def _render_iterations(console: Any, iterations: list[Any]) -> None:
    from cptrace.commands._tables import TextTable

    rows = [it for it in iterations if it.rank is None]
    if not rows:
        return
    table = TextTable(title="Iteration time (ms, slowest rank per iteration)")
    for col in ("window", "source", "n", "median", "p10", "p90", "IQR"):
        table.add_column(col, justify="left" if col in ("window", "source") else "right")
    for it in rows:
        # "timed": CUDA-event iterations without a profiler; "profiled": durations of profiled
        # steps, inflated by the profiler (several-fold with Python stacks).
        source = it.source or "?"
        table.add_row(
            it.label,
            source,
            str(it.n),
            f"{it.median_ms:.3f}",
            f"{it.p10_ms:.3f}",
            f"{it.p90_ms:.3f}",
            f"{it.iqr_ms:.3f}",
        )
    console.print(table)


def _render_findings(console: Any, findings: list[Any], title: str) -> None:
    from rich.markup import escape

    if not findings:
        console.print(f"[bold]{title}:[/] none")
        return
    console.print(f"[bold]{title}:[/]")
    for f in findings:
        style = _SEVERITY_STYLE.get(f.severity.value, "")
        basis = f.saving_basis
        saving = (
            f" (expected saving {f.expected_saving_ms:.3f} ms/iter"
            + (f", {basis})" if basis else ")")
            if f.expected_saving_ms
            else ""
        )
        head = escape(f"[{f.rule}] {f.title}{saving}")
        console.print(f"  [{style}]{f.severity.value.upper()}[/] {head}", highlight=False)
        for e in f.evidence[:12]:
            where = f" rank {e.rank}" if e.rank is not None else ""
            console.print(
                escape(f"      {e.name}{where}: {e.value} {e.unit}".rstrip()), highlight=False
            )
        console.print(escape(f"    -> {f.recommendation}"), highlight=False)


def _opt_ms(ns: float | None) -> str:
    return "-" if ns is None else _ms(ns)


def comparability_lines(result: Any) -> list[str]:
    """The typed comparability issues, each with its aspect (a refusing one's message says
    "no time verdict"), then the notes that are not one of them."""
    issues = list(result.comparability)
    lines = [f"{i.message} [{i.aspect.value}]" for i in issues]
    said = {i.message for i in issues}
    return lines + [n for n in result.notes if n not in said]


def render_comparison(result: Any, host_rows: list[Any] | None = None) -> None:
    """Warnings, helper and kernel deltas, Total GPU, per-rank rows, iteration statistics,
    base and head findings, and the one-line summary. ``host_rows``
    (``pr_bot.deltas.host_rows_for``) replace the GPU tables when a side has no GPU activity."""
    from rich.markup import escape

    from cptrace.commands._tables import TextTable

    console = _console()
    for line in comparability_lines(result):
        console.print(escape(f"warning: {line}"), style="yellow", highlight=False)
    basis = result.basis
    if not result.gpu_observed:
        _render_without_gpu(console, result, host_rows or [])
        return
    table = TextTable(
        title=f"{result.base_label} -> {result.head_label}: helpers, {basis}",
    )
    for col in (
        "helper",
        "category",
        "base launches",
        "head launches",
        "delta",
        "base GPU ms",
        "head GPU ms",
        "GPU ms delta",
        "host ms delta",
        "status",
    ):
        table.add_column(
            col, justify="left" if col in ("helper", "category", "status") else "right"
        )
    for d in result.helpers:
        if d.status == "unchanged":
            continue
        table.add_row(
            d.helper,
            d.category.value,
            f"{d.base_launches:g}",
            f"{d.head_launches:g}",
            f"{d.delta_launches:+g}",
            _ms(d.base_gpu_time_ns),
            _ms(d.head_gpu_time_ns),
            f"{d.delta_gpu_time_ns / 1e6:+.3f}",
            f"{d.delta_host_time_ns / 1e6:+.3f}",
            d.status,
        )
    console.print(table)
    unchanged = sum(1 for d in result.helpers if d.status == "unchanged")
    if unchanged:
        console.print(
            f"[dim]{unchanged} helper(s) unchanged (launches equal, times within noise)[/]"
        )
    _render_kernel_deltas(console, result)
    total = result.total_gpu
    if total is not None:
        console.print(
            f"Total GPU ({basis}): {_ms(total.base_ns)} -> {_ms(total.head_ns)} ms "
            f"({total.delta_ns / 1e6:+.3f}); kernels only {_ms(total.base_kernel_ns)} -> "
            f"{_ms(total.head_kernel_ns)} ms ({total.delta_kernel_ns / 1e6:+.3f})",
            highlight=False,
        )
    _render_rank_deltas(console, result)
    render_account_delta(console, result)
    console.print(
        f"mean over ranks: span delta {result.span_delta_ns / 1e6:+.3f} ms, GPU busy (clipped "
        f"to the windows) delta {result.busy_delta_ns / 1e6:+.3f} ms ({basis.split(',')[0]})",
        highlight=False,
    )
    _render_iterations_and_findings(console, result, method=True)


def _render_without_gpu(console: Any, result: Any, host_rows: list[Any]) -> None:
    """A comparison with a side without GPU activity: host time per helper, span, iterations
    and findings; the GPU figures would all read 0."""

    console.print(
        "helpers, kernels, Total GPU, GPU busy and where the step went: not observed: no GPU "
        "activity in this trace",
        highlight=False,
    )
    _render_host_deltas(console, result, host_rows)
    console.print(
        f"mean over ranks: span delta {result.span_delta_ns / 1e6:+.3f} ms "
        f"({result.basis.split(',')[0]})",
        highlight=False,
    )
    _render_iterations_and_findings(console, result, method=False)


def _render_host_deltas(console: Any, result: Any, rows: list[Any]) -> None:
    """Per-helper host time base -> head (``pr_bot.deltas.HostTimeRow``): what a trace without
    GPU activity has to compare, the comparison page's table."""
    from cptrace.commands._tables import TextTable

    if not rows:
        console.print("host time per helper: no helper has host ranges on either side")
        return
    table = TextTable(
        title=f"{result.base_label} -> {result.head_label}: host time per helper from the "
        f"ranges, {result.basis}",
    )
    for col in (
        "helper", "base calls", "head calls", "Δ calls", "base incl ms", "head incl ms",
        "Δ incl ms", "base self ms", "head self ms", "Δ self ms", "base first ms",
        "head first ms", "status",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col in ("helper", "status") else "right")

    def first(ms: float) -> str:
        return f"{ms:.3f}" if ms else "-"

    for r in rows:
        table.add_row(
            r.helper, f"{r.base_calls:g}", f"{r.head_calls:g}", f"{r.delta_calls:+g}",
            f"{r.base_inclusive_ms:.3f}", f"{r.head_inclusive_ms:.3f}",
            f"{r.delta_inclusive_ms:+.3f}", f"{r.base_ms:.3f}", f"{r.head_ms:.3f}",
            f"{r.delta_ms:+.3f}", first(r.base_first_call_ms), first(r.head_first_call_ms),
            r.status,
        )  # fmt: skip
    console.print(table)
    console.print(
        "[dim]calls and ms per step (whole trace: totals), summed over ranks; incl and self "
        "include the first call (compilation, warm-up), shown apart as first ms (each rank's "
        "first call, summed); self = less the catalogued helpers nested in the calls[/]"
    )


def _render_iterations_and_findings(console: Any, result: Any, *, method: bool) -> None:
    """The iterations line (and its method when asked), both sides' findings, the summary:
    the tail of every comparison, with or without GPU activity."""
    from rich.markup import escape

    from analyzers.stats import NO_INTERVAL

    it = result.iterations
    if it is not None:
        ci = (
            f"{it.confidence:.0%} CI [{it.ci_low_ms:+.3f}, {it.ci_high_ms:+.3f}] ms"
            if it.interval
            else NO_INTERVAL.format(n=min(it.base.n, it.head.n))
        )
        console.print(
            f"iterations: {it.base.median_ms:.3f} -> {it.head.median_ms:.3f} ms "
            f"({it.delta_median_pct:+.1f}%), {ci}, p={it.p_value:.3g}: {it.verdict}",
            highlight=False,
        )
        if method:
            console.print(f"[dim]{it.method}[/]")
    _render_findings(console, result.findings_base, f"Findings, base ({result.base_label})")
    _render_findings(console, result.findings_head, f"Findings, head ({result.head_label})")
    console.print(f"[bold]{escape(result.summary)}[/]", highlight=False)


def _render_kernel_deltas(console: Any, result: Any) -> None:
    from rich.markup import escape

    from cptrace.commands._tables import TextTable

    changed = [k for k in result.kernel_deltas if k.status != "unchanged"]
    if not result.kernel_deltas:
        return
    table = TextTable(
        title=f"Kernels, {result.basis} (top {min(TOP_KERNELS, len(changed))} of "
        f"{len(changed)} changed names by time change)",
    )
    for col in (
        "base count",
        "head count",
        "delta",
        "base ms",
        "head ms",
        "ms delta",
        "mean us base -> head",
        "status",
    ):
        table.add_column(col, justify="left" if col == "status" else "right")
    table.add_column("name", justify="left", overflow="fold")  # wrapped, never cut
    for k in changed[:TOP_KERNELS]:
        table.add_row(
            f"{k.base_count:g}",
            f"{k.head_count:g}",
            f"{k.delta_count:+g}",
            _ms(k.base_total_ns),
            _ms(k.head_total_ns),
            f"{k.delta_total_ns / 1e6:+.3f}",
            f"{k.base_mean_ns / 1e3:.2f} -> {k.head_mean_ns / 1e3:.2f}",
            k.status,
            escape(k.name),
        )
    console.print(table)


def _render_rank_deltas(console: Any, result: Any) -> None:
    from cptrace.commands._tables import TextTable

    if not result.ranks:
        return
    per = result.basis.split(",")[0]
    table = TextTable(title=f"Ranks, {per}, base -> head")
    for col in ("rank", "span ms", "GPU busy ms (clipped)", "total GPU ms"):
        table.add_column(col, justify="right")
    for r in result.ranks:
        table.add_row(
            str(r.rank),
            f"{_opt_ms(r.base_span_ns)} -> {_opt_ms(r.head_span_ns)}",
            f"{_opt_ms(r.base_busy_ns)} -> {_opt_ms(r.head_busy_ns)}",
            f"{_opt_ms(r.base_gpu_time_ns)} -> {_opt_ms(r.head_gpu_time_ns)}",
        )
    console.print(table)


def render_catalog(cat: Any) -> None:
    from cptrace.commands._tables import TextTable

    table = TextTable(title=f"catalog {cat.name} {cat.version}")
    for col in ("helper", "category", "finding", "patterns"):
        table.add_column(col)
    for h in cat.helpers:
        patterns = [
            *(f"range {p}" for p in h.ranges),
            *(f"python {p}" for p in h.python),
            *(f"kernel {p}" for p in h.kernels),
        ]
        flags = " (fallback)" if h.fallback else ""
        table.add_row(h.name + flags, h.category.value, h.finding or "", "\n".join(patterns))
    _console().print(table)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
    app.command("compare")(compare)
    app.command("catalog")(catalog)
