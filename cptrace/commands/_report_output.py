"""What ``cptrace analyze`` prints: the sections (``--report``), the format (``--format``) and
the JSON without timelines unless ``--full``."""

from __future__ import annotations

import csv
import enum
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any


class Section(enum.StrEnum):
    """A part of the analysis output (``--report NAME``, repeatable; default: all)."""

    SUMMARY = "summary"  # "do this first" and the whole-trace summary
    HELPERS = "helpers"  # per-group helper and rank tables (host time on a CPU run)
    KERNELS = "kernels"  # GPU devices and the per-kernel-name table
    TIMELINE = "timeline"  # GPU timelines and iteration times
    ACCOUNT = "account"  # where the step went
    FINDINGS = "findings"


class OutputFormat(enum.StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"


TIMELINE_KEYS = ("timeline", "other_timelines", "gpu_timeline", "window_timelines")
"""The report's timeline fields: left out of the JSON unless ``--full``."""

SECTION_KEYS: dict[Section, tuple[str, ...]] = {
    Section.SUMMARY: ("summary",),
    Section.HELPERS: ("helpers", "rank_summaries", "streams", "imbalance", "host_time"),
    Section.KERNELS: ("devices", "kernels"),
    Section.TIMELINE: ("iterations", *TIMELINE_KEYS),
    Section.ACCOUNT: ("accounts", "step_accounts"),
    Section.FINDINGS: ("findings", "host_syncs"),
}
"""The report keys of each section in the JSON (``--report`` given)."""

ALWAYS_KEYS = ("schema_version", "catalog_version", "sources", "ranks", "windows", "groups",
               "notes", "environment", "failure")  # fmt: skip
"""Keys every JSON keeps: what was analysed (``--report`` selects only the rest)."""


def chosen(sections: Sequence[Section] | None) -> set[Section]:
    """The sections to print: all when none is named."""
    return set(sections) if sections else set(Section)


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
    if section is Section.SUMMARY:
        summary = report.summary
        if summary is not None:
            for table in ("do_first", "families", "cpu_ops", "ranges", "sync_pointers"):
                yield from ((table, r) for r in getattr(summary, table))
    elif section is Section.HELPERS:
        yield from (("helpers", h) for h in report.helpers)
        yield from (("ranks", r) for r in report.rank_summaries)
        if report.host_time is not None:
            yield from (("host_time", h) for h in report.host_time.helpers)
    elif section is Section.KERNELS:
        yield from (("devices", d) for d in report.devices)
        yield from (("kernels", k) for k in report.kernels)
    elif section is Section.TIMELINE:
        yield from (("iterations", i) for i in report.iterations)
        yield from (("gpu_timeline", t) for t in report.gpu_timeline)
    elif section is Section.ACCOUNT:
        yield from (("accounts", a) for a in report.accounts)
    else:
        yield from (("findings", f) for f in report.findings)


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
    for section in (s for s in Section if s in chosen(sections)):
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
    "OutputFormat",
    "Section",
    "chosen",
    "report_csv",
    "report_json",
]
