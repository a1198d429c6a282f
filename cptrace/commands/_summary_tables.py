"""The summary of any trace in the terminal: "do this first" and the whole-trace tables."""

from __future__ import annotations

from typing import Any


def render_do_first(console: Any, summary: Any) -> None:
    """At most three actions, their saving and evidence, before everything else."""
    from rich.markup import escape

    if summary is None or not summary.do_first:
        return
    console.print("[bold]Do this first[/]")
    for i, a in enumerate(summary.do_first, 1):
        saving = f" ({a.saving_text})" if a.saving_text else ""
        console.print(f"  {i}. {escape(a.action)}{saving}", highlight=False)
        console.print(f"     [dim]{escape(a.evidence)}[/]", highlight=False)


def render_summary(console: Any, summary: Any) -> None:
    """GPU time by family, top CPU ops, uncatalogued ranges, sync lines (whole trace, totals)."""
    from cptrace.commands._tables import TextTable

    if summary is None:
        return
    if summary.families:
        table = TextTable(title="whole trace: GPU time by kernel family (totals, all ranks)")
        for col in ("family", "library", "activities", "GPU ms", "share"):
            table.add_column(col, justify="left" if col in ("family", "library") else "right")
        for r in summary.families:
            table.add_row(r.family.value, r.library, str(r.activities),
                          f"{r.gpu_time_ns / 1e6:.3f}", f"{100 * r.share:.1f}%")
        console.print(table)
    for title, rows in (
        ("whole trace: top CPU ops by self time (totals, all ranks)", summary.cpu_ops),
        ("whole trace: uncatalogued NVTX / record_function ranges (totals)", summary.ranges),
    ):
        if not rows:
            continue
        table = TextTable(title=title)
        for col in ("name", "calls", "inclusive ms", "self ms"):
            table.add_column(col, justify="left" if col == "name" else "right", overflow="fold")
        for r in rows:
            table.add_row(r.name, str(r.calls), f"{r.inclusive_ns / 1e6:.3f}",
                          f"{r.self_ns / 1e6:.3f}")
        console.print(table)
    if summary.communication_share is not None:
        console.print(f"communication share: {100 * summary.communication_share:.1f}%")
    for p in summary.sync_pointers:
        console.print(f"host sync: {p.text}", highlight=False)
