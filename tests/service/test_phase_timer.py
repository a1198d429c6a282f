"""The one phase timer (``service.phase_timer``): laps, CPU, the ``Server-Timing`` header."""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

from service.phase_timer import PhaseTimer

REPO = Path(__file__).resolve().parents[2]


def test_laps_in_order_then_total_then_the_inner_timer() -> None:
    inner = PhaseTimer(cpu=True)
    sum(range(200_000))  # some CPU for the inner timer to count
    inner.lap("read")
    inner.record("sync-wait", 0.25)
    staged = inner.done()
    assert list(staged) == ["read", "sync-wait", "cpu"] and staged["sync-wait"] == 0.25
    assert staged["cpu"] > 0
    outer = PhaseTimer()
    time.sleep(0.01)
    outer.lap("receive")
    outer.lap("stage")
    header = outer.server_timing(staged, prefix="stage-")
    names = re.findall(r"([\w-]+);dur=([\d.]+)", header)
    assert [n for n, _ in names] == [
        "receive", "stage", "total", "stage-read", "stage-sync-wait", "stage-cpu",
    ]  # fmt: skip
    durations = dict((n, float(d)) for n, d in names)
    assert durations["receive"] >= 10.0 and durations["stage-sync-wait"] == 250.0
    assert durations["total"] >= durations["receive"] + durations["stage"] - 0.2
    assert PhaseTimer().done() == {}  # no cpu unless asked for


def test_no_other_module_keeps_a_phase_timer() -> None:
    """A class with a ``lap`` method anywhere else would be a second timer."""
    found = []
    for package in ("service", "web", "cptrace", "analyzers", "runners", "pr_bot"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "service" / "phase_timer.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(f, ast.FunctionDef) and f.name == "lap" for f in node.body
                ):
                    found.append(f"{path.relative_to(REPO)}: {node.name}")
    assert not found, "phase timers outside service/phase_timer.py: " + ", ".join(found)
