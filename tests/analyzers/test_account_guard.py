"""The account refuses to publish a window whose lines do not add up to its span.

The check runs on the lines as the summaries publish them (``build._check_spans``), so a
summary that lost or double-counted time is caught where it would reach the report. The bug
is injected by wrapping the real summaries and dropping one line of one window."""

from __future__ import annotations

from typing import Any

import pytest

from analyzers.account import build
from analyzers.model import RangeKind
from analyzers.pipeline import analyze_trace
from tests.analyzers.factories import TraceBuilder


def _trace() -> Any:
    b = TraceBuilder()
    b.range("ProfilerStep#1", 0, 600, kind=RangeKind.STEP)
    b.kernel("elementwise_kernel", 10, 20, 80)
    b.kernel("gemm", 200, 205, 95)
    return b.build()


def test_whole_account_adds_up_without_the_bug() -> None:
    report = analyze_trace(_trace()).report
    assert report.step_accounts
    for step in report.step_accounts:
        assert sum(p.time_ns for p in step.parts) == step.span_ns


def test_a_lost_line_is_refused_naming_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    real = build._summaries

    def losing(*args: Any, **kwargs: Any) -> dict[int, list[build.PartDict]]:
        out = real(*args, **kwargs)
        if kwargs.get("per_window"):
            first = min(out)
            out[first] = out[first][1:]
        return out

    monkeypatch.setattr(build, "_summaries", losing)
    with pytest.raises(RuntimeError, match=r"parts add up to \d+ ns, span is \d+ ns"):
        analyze_trace(_trace())
