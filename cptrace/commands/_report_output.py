"""What ``cptrace analyze`` prints: the sections (``--report``), the format (``--format``) and
the JSON without timelines unless ``--full``."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from cptrace.commands.analyze import ALL_SECTIONS, Section

TIMELINE_KEYS = ("timeline", "other_timelines", "gpu_timeline", "window_timelines")
"""The report's timeline fields: left out of the JSON unless ``--full``."""

SECTION_KEYS: dict[Section, tuple[str, ...]] = {
    Section.HELPERS: ("helpers", "streams", "imbalance"),
    Section.RANKS: ("rank_summaries",),
    Section.TIMELINE: TIMELINE_KEYS,
    Section.ACCOUNT: ("accounts", "step_accounts"),
    Section.DEVICES: ("devices",),
    Section.KERNELS: ("kernels",),
    Section.SUMMARY: ("summary",),
    Section.HOST: ("host_time", "host_syncs"),
    Section.ITERATIONS: ("iterations",),
    Section.FINDINGS: ("findings",),
}
"""The report keys of each section in the JSON (``--report`` given)."""

ALWAYS_KEYS = ("schema_version", "catalog_version", "sources", "ranks", "windows", "groups",
               "notes", "environment", "failure")  # fmt: skip
"""Keys every JSON keeps: what was analysed (``--report`` selects only the rest)."""


def report_json(report: Any, sections: Sequence[Section] | None, *, full: bool) -> dict[str, Any]:
    """The report as JSON data: without timelines unless ``full``; only the named sections'
    keys (and :data:`ALWAYS_KEYS`) when ``--report`` was given. A failed run's ``failure``
    leads, as in the text."""
    payload: dict[str, Any] = json.loads(report.model_dump_json())
    if sections:
        keep = set(ALWAYS_KEYS).union(*(SECTION_KEYS[s] for s in sections))
        payload = {k: v for k, v in payload.items() if k in keep}
    if not full:
        payload = {k: v for k, v in payload.items() if k not in TIMELINE_KEYS}
    if payload.get("failure") is not None:
        payload = {"failure": payload.pop("failure"), **payload}
    return payload


def _rows(report: Any, section: Section) -> Iterable[tuple[str, Any]]:
    """(table, row model) of a section, for CSV."""
    summary, host = report.summary, report.host_time
    tables: dict[Section, list[tuple[str, Sequence[Any]]]] = {
        Section.HELPERS: [("helpers", report.helpers)],
        Section.RANKS: [("ranks", report.rank_summaries)],
        Section.TIMELINE: [("gpu_timeline", report.gpu_timeline)],
        Section.ACCOUNT: [("accounts", report.accounts)],
        Section.DEVICES: [("devices", report.devices)],
        Section.KERNELS: [("kernels", report.kernels)],
        Section.SUMMARY: [
            (t, getattr(summary, t) if summary is not None else [])
            for t in ("do_first", "families", "cpu_ops", "ranges", "sync_pointers")
        ],
        Section.HOST: [("host_time", host.helpers if host is not None else [])],
        Section.ITERATIONS: [("iterations", report.iterations)],
        Section.FINDINGS: [("findings", report.findings)],
    }
    for table, rows in tables[section]:
        yield from ((table, row) for row in rows)


def _cell(value: Any) -> Any:
    """A CSV cell: nested lists and objects as compact JSON, None as empty."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return value


def report_csv(report: Any, sections: Sequence[Section] | None) -> str:
    """One CSV of the chosen sections: a ``section`` and a ``table`` column, then the union of
    the rows' fields in first-seen order (a row leaves the others empty)."""
    rows: list[dict[str, Any]] = []
    columns: dict[str, None] = {"section": None, "table": None}
    wanted = set(sections) if sections else ALL_SECTIONS
    for section in (s for s in Section if s in wanted):
        for table, model in _rows(report, section):
            row = {"section": section.value, "table": table}
            row.update((k, _cell(v)) for k, v in model.model_dump(mode="json").items())
            columns.update(dict.fromkeys(row))
            rows.append(row)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


__all__ = [
    "ALWAYS_KEYS",
    "SECTION_KEYS",
    "TIMELINE_KEYS",
    "report_csv",
    "report_json",
]
