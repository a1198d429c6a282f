"""The step account of base and head side by side: per step, mean over ranks.

Why the mean over ranks (and not the sum the helper deltas use): an account line is time on one
rank's timeline; summing ranks would report a 2-rank step as twice its length. A line a rank
does not have counts 0 on that rank. Per-part totals come first under the label ``ALL``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from analyzers.report import (
    AccountDelta,
    AccountPartKind,
    AnalysisReport,
    Category,
    GroupAccount,
)

ALL = "(all)"
"""Label of a part's total line."""

_Key = tuple[AccountPartKind, str]


def _per_step(groups: Sequence[GroupAccount]) -> tuple[dict[_Key, float], dict[_Key, Category]]:
    ranks = len({g.rank for g in groups}) or 1
    lines: dict[_Key, float] = defaultdict(float)
    categories: dict[_Key, Category] = {}
    for g in groups:
        steps = max(g.steps, 1)
        for p in g.parts:
            for key in ((p.part, p.label), (p.part, ALL)):
                lines[key] += p.time_ns / steps / ranks
            if p.category is not None:
                categories[(p.part, p.label)] = p.category
    return lines, categories


def account_deltas(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[AccountDelta]:
    """Every account line of either side, head minus base; part totals first, then the lines
    by the size of their change."""
    b, b_cat = _per_step([g for g in base.accounts if g.window == base_window])
    h, h_cat = _per_step([g for g in head.accounts if g.window == head_window])
    order = list(AccountPartKind)
    out = [
        AccountDelta(
            part=part,
            label=label,
            category=b_cat.get((part, label)) or h_cat.get((part, label)),
            base_ns=b.get((part, label), 0.0),
            head_ns=h.get((part, label), 0.0),
            delta_ns=h.get((part, label), 0.0) - b.get((part, label), 0.0),
        )
        for part, label in set(b) | set(h)
    ]
    return sorted(
        out,
        key=lambda d: (
            d.label != ALL,
            order.index(d.part) if d.label == ALL else 0,
            -abs(d.delta_ns),
            d.label,
        ),
    )


__all__ = ["ALL", "account_deltas"]
