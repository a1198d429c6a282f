"""Rich tables of the step account for ``cptrace analyze`` and ``cptrace compare``.

Not a command module (no ``register``): ``analyze.py`` calls these after its own tables.
"""

from __future__ import annotations

from typing import Any

LINES_PER_PART = 4
"""Lines shown under each part (the ``--json`` output has them all)."""
TOP_IDLE = 5
TOP_DELTAS = 12
_IDLE = (
    "idle: host-bound",
    "idle: synchronisation",
    "idle: waiting on another rank",
    "idle: other",
)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _part_order() -> list[str]:
    from analyzers.report import AccountPartKind

    return [k.value for k in AccountPartKind]


def render_account(console: Any, report: Any, group: str) -> None:
    """ "Where the step went": per part and its largest lines, one column pair per rank, and
    the top idle causes with their largest gap."""
    from rich.markup import escape

    from cptrace.commands._tables import TextTable

    accounts = sorted((a for a in report.accounts if a.window == group), key=lambda a: a.rank)
    if not accounts:
        return
    whole = group == "whole trace"
    unit = "ms" if whole else "ms/step"
    title = f"{group}: where the {'trace' if whole else 'step'} went"
    table = TextTable(title=title)
    table.add_column("part")
    table.add_column("attributed to")
    for a in accounts:
        table.add_column(f"rank {a.rank} {unit}", justify="right")
        table.add_column("%", justify="right")
    per: list[dict[tuple[str, str], int]] = []
    for a in accounts:
        lines: dict[tuple[str, str], int] = {}
        for p in a.parts:
            lines[(p.part.value, p.label)] = lines.get((p.part.value, p.label), 0) + p.time_ns
        per.append(lines)

    def cells(key: tuple[str, str] | str) -> list[str]:
        out = []
        for a, lines in zip(accounts, per, strict=True):
            steps = 1 if whole else max(a.steps, 1)
            if isinstance(key, str):
                ns = sum(v for (part, _), v in lines.items() if part == key)
            else:
                ns = lines.get(key, 0)
            out += [_ms(ns / steps), f"{100 * ns / a.span_ns:.1f}" if a.span_ns else "-"]
        return out

    table.add_row(
        "span",
        "",
        *[
            c
            for a in accounts
            for c in (_ms(a.span_ns / (1 if whole else max(a.steps, 1))), "100.0")
        ],
    )
    for part in _part_order():
        labels = {label for lines in per for (p, label) in lines if p == part}
        if not labels:
            continue
        table.add_row(f"[bold]{escape(part)}[/]", "", *cells(part))
        top = sorted(labels, key=lambda lb: -max(lines.get((part, lb), 0) for lines in per))
        for label in top[:LINES_PER_PART]:
            table.add_row("", escape(label), *cells((part, label)))
        if len(top) > LINES_PER_PART:
            table.add_row(
                "",
                f"[dim]... {len(top) - LINES_PER_PART} more (--json)[/]",
                *([""] * (2 * len(accounts))),
            )
    console.print(table)
    causes = [(a, p) for a in accounts for p in a.parts if p.part.value in _IDLE]
    causes.sort(key=lambda ap: -ap[1].time_ns / (1 if whole else max(ap[0].steps, 1)))
    if not causes:
        return
    console.print(f"[bold]{escape(group)}: top idle causes[/]")
    for a, p in causes[:TOP_IDLE]:
        steps = 1 if whole else max(a.steps, 1)
        line = f"  rank {a.rank}: {p.part.value} in {p.label} {_ms(p.time_ns / steps)} {unit}"
        line += f" ({p.gaps} gap{'s' if p.gaps != 1 else ''}"
        if p.largest:
            g = p.largest[0]
            line += (
                f"; largest {_ms(g.duration_ns)} ms at +{_ms(g.offset_ns)} ms in "
                + (g.window if g.window != a.window else f"{g.window}#{g.index}")
            )
        if p.thread:
            line += f"; thread {p.thread}"
        if p.detail:
            line += f"; {p.detail}"
        console.print(escape(line + ")"), highlight=False)


def render_account_delta(console: Any, result: Any) -> None:
    """Base and head side by side, part totals first, then the lines that moved most."""
    from rich.markup import escape

    from cptrace.commands._tables import TextTable

    if not result.account:
        return
    table = TextTable(
        title=f"where the step went: {result.base_label} -> {result.head_label} "
        f"(ms {'per step' if result.basis.startswith('per step') else 'in the whole trace'}, "
        "mean over ranks)",
    )
    for col in ("part", "attributed to", "base", "head", "delta"):
        table.add_column(col, justify="right" if col in ("base", "head", "delta") else "left")
    totals = [d for d in result.account if d.label == "(all)"]
    lines = [d for d in result.account if d.label != "(all)"]
    for d in totals:
        table.add_row(
            escape(d.part.value),
            "[dim](all)[/]",
            _ms(d.base_ns),
            _ms(d.head_ns),
            f"{d.delta_ns / 1e6:+.3f}",
        )
    for d in lines[:TOP_DELTAS]:
        if abs(d.delta_ns) < 1e3:
            break
        table.add_row(
            escape(d.part.value),
            escape(d.label),
            _ms(d.base_ns),
            _ms(d.head_ns),
            f"{d.delta_ns / 1e6:+.3f}",
        )
    console.print(table)


__all__ = ["render_account", "render_account_delta"]
