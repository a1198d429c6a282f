"""Render a comparison as a GitHub pull-request comment (pure: models in, markdown out).

The comment starts with a hidden marker, ``<!-- cptrace:suite=NAME -->``, so the poster can find
its own comment for a suite among the others on the pull request and update it in place instead
of adding a new one per push. Names from traces are C++ identifiers (``foo<int, 4>``, ``a|b`` in
demangled lambdas), which GitHub would read as HTML tags or table separators: every name goes
through :func:`md_code`, every free text through :func:`md_text`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzers.failure import failure_headline, failure_of, rank_stacks
from analyzers.manifest import FailureRecord
from analyzers.report import Action, ComparisonReport, Finding, HelperDelta, Severity
from pr_bot import labels
from pr_bot.deltas import HostTimeRow, metric_rows

MAX_COMMENT_CHARS = 65_536
"""GitHub refuses issue comments longer than this."""

_SUITE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,99}$")
_NS_PER_MS = 1e6
_VERDICT_ICON = {
    "faster": ":rocket:",
    "slower": ":warning:",
    "no significant change": ":white_check_mark:",
}
_SEVERITY_ICON = {Severity.ERROR: ":x:", Severity.WARNING: ":warning:", Severity.INFO: ":bulb:"}


class CommentError(ValueError):
    """The comment cannot be rendered from the given inputs (e.g. an unusable suite name)."""


@dataclass(frozen=True, slots=True)
class CommentContext:
    """What the comment says about the two runs beyond the report itself."""

    suite: str = "default"
    base_name: str = "base"
    head_name: str = "head"
    comparison_url: str | None = None
    base_failure: FailureRecord | None = None
    """The base run's failure record when its job failed or hung (manifest ``failure``)."""
    head_failure: FailureRecord | None = None


@dataclass(frozen=True, slots=True)
class CommentRun:
    """One side of the comparison as the comment names it: a stored run and its manifest."""

    id: int
    name: str
    commit: str | None = None
    manifest: Mapping[str, Any] | None = None
    """The stored manifest (JSON); its ``failure`` makes the comment lead with the failure."""


def comment_context(
    *,
    suite: str,
    base: CommentRun,
    head: CommentRun,
    base_window: str | None = None,
    head_window: str | None = None,
    link_root: str | None = None,
) -> CommentContext:
    """The one place a comment's context is built (service endpoint, comparison page, PR loop):
    run labels, the comparison link under ``link_root`` (none without one) and both failures."""
    url = None
    if link_root:
        url = link_root.rstrip("/") + labels.compare_url(base.id, head.id, base_window, head_window)
    return CommentContext(
        suite=suite,
        base_name=labels.run_label(base.id, base.name, base.commit, base_window),
        head_name=labels.run_label(head.id, head.name, head.commit, head_window),
        comparison_url=url,
        base_failure=failure_of(base.manifest),
        head_failure=failure_of(head.manifest),
    )


def suite_marker(suite: str) -> str:
    """The hidden HTML comment that identifies this suite's comment on a pull request."""
    if not _SUITE_RE.match(suite):
        raise CommentError(
            f"suite name {suite!r} is not usable in a comment marker: expected 1-100 characters "
            "of letters, digits and ._:/+- starting with a letter or digit"
        )
    return f"<!-- cptrace:suite={suite} -->"


def md_text(text: str) -> str:
    """Escape free text for a markdown table cell: no HTML, no column breaks, one line."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return escaped.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def md_code(name: str) -> str:
    """A helper or kernel name as inline code, safe inside a table cell."""
    body = name.replace("\n", " ").replace("`", "'").replace("|", "\\|")
    return f"`{body}`"


def _num(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _signed(value: float, digits: int = 2) -> str:
    return f"{value:+,.{digits}f}"


def _metric_rows(report: ComparisonReport) -> list[str]:
    lines = []
    for row in metric_rows(report):
        name = row.label  # with its unit and basis (pr_bot.labels)
        digits = 1 if not row.unit else 2 if row.metric.startswith("iteration") else 3
        base = "" if row.base is None else _num(row.base, digits)
        head = "" if row.head is None else _num(row.head, digits)
        delta = _signed(row.delta, digits)
        if row.delta_pct is not None:
            delta += f" ({row.delta_pct / 100:+.1%})"
        sig = f"**{row.significance}**" if row.significance == "significant" else row.significance
        lines.append(f"| {name} | {base} | {head} | {delta} | {sig}: {md_text(row.detail)} |")
    return lines


def _helper_rows(helpers: Sequence[HelperDelta], limit: int) -> tuple[list[str], int]:
    changed = [d for d in helpers if d.status != "unchanged"]
    changed.sort(key=lambda d: (abs(d.delta_launches), abs(d.delta_gpu_time_ns)), reverse=True)
    rows = [
        f"| {md_code(d.helper)} | {md_text(d.category.value)} | {_num(d.base_launches, 1)} | "
        f"{_num(d.head_launches, 1)} | {_signed(d.delta_launches, 1)} | "
        f"{_signed(d.delta_gpu_time_ns / _NS_PER_MS, 3)} | {d.status} |"
        for d in changed[:limit]
    ]
    return rows, max(0, len(changed) - limit)


def _kernel_rows(report: ComparisonReport, limit: int) -> tuple[list[str], int]:
    changed = [k for k in report.kernel_deltas if k.status != "unchanged"]
    changed.sort(key=lambda k: (abs(k.delta_total_ns), abs(k.delta_count)), reverse=True)
    rows = [
        f"| {md_code(k.name)} | {_num(k.base_count, 1)} | {_num(k.head_count, 1)} | "
        f"{_signed(k.delta_count, 1)} | {_signed(k.delta_total_ns / _NS_PER_MS, 3)} | "
        f"{_signed(k.delta_mean_ns / 1e3, 2)} | {k.status} |"
        for k in changed[:limit]
    ]
    return rows, max(0, len(changed) - limit)


def _kernel_section(report: ComparisonReport, heading: str, limit: int) -> list[str]:
    """Total GPU time and the kernels whose count or time changed most (largest first)."""
    lines: list[str] = []
    total = report.total_gpu
    if total is not None and (total.base_ns or total.head_ns):
        pct = f" ({total.delta_ns / total.base_ns:+.1%})" if total.base_ns else ""
        lines += [
            f"Total GPU time ({md_text(report.basis)}): {_num(total.base_ns / _NS_PER_MS, 3)} -> "
            f"{_num(total.head_ns / _NS_PER_MS, 3)} ms, {_signed(total.delta_ns / _NS_PER_MS, 3)} "
            f"ms{pct}; kernels only {_signed(total.delta_kernel_ns / _NS_PER_MS, 3)} ms.",
            "",
        ]
    rows, more = _kernel_rows(report, limit)
    if rows:
        lines += [
            f"{heading} Top kernel deltas ({md_text(report.basis)})",
            "",
            "| kernel | base count | head count | Δ count | Δ total ms | Δ mean µs | status |",
            "|---|---:|---:|---:|---:|---:|---|",
            *rows,
        ]
        if more:
            lines.append(f"\n…and {more} more changed kernels on the comparison page.")
        lines.append("")
    return lines


def host_time_headline(rows: Sequence[HostTimeRow]) -> str | None:
    """One sentence naming the helper whose host time grew most (None: none grew)."""
    grown = [r for r in rows if r.delta_ms > 0]
    if not grown:
        return None
    top = grown[0]
    return (
        f"Host time grew most in {md_code(top.helper)}: {_signed(top.delta_ms, 3)} "
        f"{labels.HOST_MS_PER_STEP} ({top.status}; {labels.HOST_CALLS_PER_STEP} "
        f"{_num(top.base_calls, 1)} -> {_num(top.head_calls, 1)}, summed over ranks)."
    )


def _host_time_section(rows: Sequence[HostTimeRow], heading: str, limit: int) -> list[str]:
    """Per-helper host time, base vs head: the per-helper figures a CPU-only trace has."""
    shown = [r for r in rows if r.status != "same calls" or abs(r.delta_ms) >= 0.001][:limit]
    if not shown:
        return ["No helper changed its host-side calls or host time.", ""]
    body = [
        f"| {md_code(r.helper)} | {_num(r.base_calls, 1)} | {_num(r.head_calls, 1)} | "
        f"{_signed(r.delta_calls, 1)} | {_num(r.base_ms, 3)} | {_num(r.head_ms, 3)} | "
        f"{_signed(r.delta_ms, 3)} | {r.status} |"
        for r in shown
    ]
    more = sum(1 for r in rows if r.status != "same calls" and r not in shown)
    lines = [
        f"{heading} Per-helper host time ({md_text(labels.HOST_BASIS)})",
        "",
        f"| helper | base {labels.HOST_CALLS_PER_STEP} | head | Δ calls | "
        f"base {labels.HOST_MS_PER_STEP} | head | Δ {labels.HOST_MS_PER_STEP} | status |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        *body,
    ]
    if more > 0:
        lines.append(f"\n…and {more} more helpers whose calls changed on the comparison page.")
    return [*lines, ""]


def _account_section(report: ComparisonReport, heading: str, limit: int) -> list[str]:
    """Where the step's time went, base vs head: the account lines that moved most (lines under
    a microsecond per step are noise and left to the comparison page)."""
    moved = [d for d in report.account if d.label == "(all)" or abs(d.delta_ns) >= 1_000]
    if not moved:
        return []
    rows = [
        f"| {md_text(d.part.value)} | "
        f"{'*all*' if d.label == '(all)' else md_code(d.label)} | "
        f"{_num(d.base_ns / _NS_PER_MS, 3)} | {_num(d.head_ns / _NS_PER_MS, 3)} | "
        f"{_signed(d.delta_ns / _NS_PER_MS, 3)} |"
        for d in moved[:limit]
    ]
    return [
        f"{heading} Where the step went (per step, mean over ranks)",
        "",
        "| part | attributed to | base ms | head ms | Δ ms |",
        "|---|---|---:|---:|---:|",
        *rows,
        "",
    ]


def _finding_line(finding: Finding, tag: str = "") -> str:
    icon = _SEVERITY_ICON.get(finding.severity, "")
    saving = ""
    if finding.expected_saving_ms is not None:
        saving = f" Expected saving: about {finding.expected_saving_ms:.2f} ms per iteration"
        if finding.expected_saving_pct is not None:
            saving += f" ({finding.expected_saving_pct:.1f}%)"
        saving += "."
    helper = f" ({md_code(finding.helper)})" if finding.helper else ""
    refs = f" See {md_text(', '.join(finding.references))}." if finding.references else ""
    return (
        f"- {icon} {tag}**{md_text(finding.title)}**{helper}: "
        f"{md_text(finding.recommendation)}{saving}{refs}"
    )


def _findings_section(report: ComparisonReport) -> list[str]:
    base_rules = {f.rule for f in report.findings_base}
    head_rules = {f.rule for f in report.findings_head}
    lines = [
        _finding_line(f, "new: " if f.rule not in base_rules else "") for f in report.findings_head
    ]
    lines += [
        f"- :heavy_check_mark: resolved: ~~{md_text(f.title)}~~"
        for f in report.findings_base
        if f.rule not in head_rules
    ]
    return lines or ["No findings on either run."]


LOG_TAIL_LINES = 40
"""Lines of a failed job's log shown in a comment (the run page shows the whole tail)."""
STACK_LINES = 40
"""Lines of each rank's stack shown in a comment."""
_FAILED_ICON = ":x:"


def fenced(summary: str, lines: Sequence[str], limit: int) -> list[str]:
    """A collapsed, fenced block of the last ``limit`` lines (fences inside are defused)."""
    kept = list(lines)[-limit:]
    body = "\n".join(kept).replace("```", "'''")
    note = f" (last {len(kept)} of {len(lines)} lines)" if len(kept) < len(lines) else ""
    return [
        f"<details><summary>{md_text(summary)}{note}</summary>", "", "```text", body, "```", "",
        "</details>",
    ]  # fmt: skip


def failure_lines(failure: FailureRecord, *, log_tail: Sequence[str] = ()) -> list[str]:
    """A failed or hung job: which rank raised what where (or where each rank was waiting),
    then each rank's stack, the traceback and the log tail, each bounded and collapsed.

    ``log_tail`` stands in when the record has none (the job's own tail from the agent).
    """
    lines = [f"{_FAILED_ICON} **The job failed**: {md_text(failure_headline(failure))}", ""]
    for s in rank_stacks(failure):
        where = f" waiting at {s.waiting_at.where()}" if s.waiting_at else ""
        lines += fenced(f"rank {s.rank}{where}", s.text.rstrip().splitlines(), STACK_LINES)
    traceback = (failure.exception or {}).get("traceback")
    if isinstance(traceback, list) and traceback:
        lines += fenced("traceback", [str(t) for t in traceback], STACK_LINES)
    tail = list(failure.log_tail) or list(log_tail)
    if tail:
        lines += fenced("log tail", tail, LOG_TAIL_LINES)
    return [*lines, ""]


def comparison_lines(
    report: ComparisonReport,
    context: CommentContext,
    *,
    helper_limit: int = 30,
    kernel_limit: int = 10,
    level: int = 4,
    host_rows: Sequence[HostTimeRow] | None = None,
) -> list[str]:
    """The comparison without marker and title: summary, runs, tables, findings, link.

    Shared by :func:`render_comment` (one comparison) and the loop's suite comment (one section
    per spec); ``level`` is the markdown heading level of its sub-sections. ``host_rows``
    (``pr_bot.deltas.host_time_rows``, given when a run has no GPU activity) replace the
    launch table, which is empty then.
    """
    heading = "#" * level
    lines: list[str] = []
    for side, failure in (("head", context.head_failure), ("base", context.base_failure)):
        if failure is not None:
            lines += [f"The {side} run's job failed; its figures cover only what ran before.", ""]
            lines += failure_lines(failure)
    lines += [md_text(report.summary), "", *do_first_lines(report.do_first_head, heading)]
    lines += [
        f"Base: {md_code(context.base_name)} ({md_text(report.base_label)}) · "
        f"head: {md_code(context.head_name)} ({md_text(report.head_label)})",
        "",
        "| metric | base | head | delta | significance |",
        "|---|---:|---:|---:|---|",
        *_metric_rows(report),
        "",
    ]
    helper_rows, more = _helper_rows(report.helpers, helper_limit)
    if host_rows is not None and not helper_rows:
        # No GPU activity: host ranges are the only per-helper figures (analyzers.host_time).
        lines += [
            "No GPU activity in one of the runs: no launch or kernel rows, host time instead.",
            "",
            *_host_time_section(host_rows, heading, helper_limit),
        ]
    elif helper_rows:
        lines += [
            f"{heading} Per-helper launch deltas (per step, summed over ranks)",
            "",
            "| helper | category | base | head | Δ launches | Δ GPU ms | status |",
            "|---|---|---:|---:|---:|---:|---|",
            *helper_rows,
        ]
        if more:
            lines.append(f"\n…and {more} more changed helpers on the comparison page.")
        lines.append("")
    else:
        lines += ["No helper changed its launch count or GPU time.", ""]
    if report.gpu_observed:  # else kernels and the account would read 0 and "idle: other"
        lines += _kernel_section(report, heading, kernel_limit)
        lines += _account_section(report, heading, kernel_limit)
    lines += comparability_section(report)
    lines += [f"{heading} Findings (head)", "", *_findings_section(report), ""]
    if context.comparison_url:
        lines.append(f"[Full comparison]({context.comparison_url})")
    return lines


def comparability_section(report: ComparisonReport) -> list[str]:
    """The typed comparability issues (``ComparisonReport.comparability``: aspect, and whether
    it refuses the time verdict), then the notes that are not one of them; empty when none."""
    said = {i.message for i in report.comparability}
    items = [
        f"> - **{md_text(i.aspect.value.replace('_', ' '))}**"
        f"{' (no time verdict)' if i.refuses_time_verdict else ''}: {md_text(i.message)}"
        for i in report.comparability
    ] + [f"> - {md_text(n)}" for n in report.notes if n not in said]
    return ["> :warning: Comparability:", ">", *items, ""] if items else []


def do_first_lines(actions: Sequence[Action], heading: str) -> list[str]:
    """The head run's "do this first": at most three actions, saving and evidence; empty when
    it has none."""
    if not actions:
        return []
    lines = [f"{heading} Do this first (head)", ""]
    for i, a in enumerate(actions, 1):
        saving = f" {md_text(a.saving_text.capitalize())}." if a.saving_text else ""
        lines.append(f"{i}. **{md_text(a.action)}**{saving} Evidence: {md_text(a.evidence)}")
    return [*lines, ""]


def finding_lines(findings: Sequence[Finding]) -> list[str]:
    """One run's findings with their recommendations (no comparison to mark new ones)."""
    return [_finding_line(f) for f in findings] or ["No findings."]


def render_comment(
    report: ComparisonReport,
    context: CommentContext,
    *,
    helper_limit: int = 30,
    host_rows: Sequence[HostTimeRow] | None = None,
) -> str:
    """The full comment body, capped at :data:`MAX_COMMENT_CHARS` by :func:`cap_length`."""
    marker = suite_marker(context.suite)
    icon = _VERDICT_ICON.get(report.verdict, ":grey_question:")
    verdict = report.verdict
    if context.head_failure is not None or context.base_failure is not None:
        icon, verdict = _FAILED_ICON, "failed"  # never a green verdict over a failed job
    lines = [
        marker,
        f"### cptrace · {md_text(context.suite)}: {icon} {md_text(verdict)}",
        "",
        *comparison_lines(report, context, helper_limit=helper_limit, host_rows=host_rows),
    ]
    return cap_length("\n".join(lines) + "\n", context.comparison_url)


def cap_length(body: str, link: str | None = None, limit: int = MAX_COMMENT_CHARS) -> str:
    """Cut ``body`` at a line boundary so that it and a visible notice fit in ``limit``.

    The marker on the first line always survives, so a truncated comment is still found and
    updated on the next push.
    """
    if len(body) <= limit:
        return body
    where = f" The full comparison: {link}" if link else ""
    notice_template = (
        "\n\n> :scissors: **Truncated**: {cut:,} characters were cut to fit GitHub's "
        f"{limit:,}-character limit.{where}\n"
    )
    room = limit - len(notice_template.format(cut=len(body)))
    cut_at = body.rfind("\n", 0, room)
    if cut_at <= 0:
        cut_at = room
    return body[:cut_at] + notice_template.format(cut=len(body) - cut_at)
