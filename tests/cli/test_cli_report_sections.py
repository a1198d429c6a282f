"""``cptrace analyze --report SECTION``: only the sections asked for, in the report's order, each
as the full report prints it; the sources and notes always; an unknown section is a usage
error naming the valid ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptrace.cli import app

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[2]
PAIR = [
    str(ROOT / "tests/data/te-2.20.2-h200x2" / f"kineto_3arms_rank{rank}.json.gz")
    for rank in (0, 1)
]


def _analyze(*extra: str) -> str:
    result = CliRunner().invoke(app, ["analyze", *PAIR, "--step-pattern", "^arm:", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_report_prints_only_the_sections_asked_for() -> None:
    full = _analyze()
    part = _analyze("--report", "findings", "--report", "kernels")
    assert "helpers, per step" in full and "ranks, per step" in full
    assert "helpers, per step" not in part and "ranks, per step" not in part
    kernels = part.index("Kernels, whole trace")
    findings = part.index("Findings:")
    assert part.startswith("cptrace analysis catalog")
    assert findings < kernels  # the report's order (findings first), whatever the order asked
    # each section exactly as the full report prints it (notes end both)
    assert part[findings:kernels] in full
    notes = part.index("note: ", kernels)
    assert part[kernels:notes] in full
    assert full.endswith(part[notes:])
    assert len(part.splitlines()) < len(full.splitlines()) / 4


def test_unknown_section_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["analyze", *PAIR, "--report", "nope"])
    assert result.exit_code == 2
    assert "'nope' is not one of" in result.output and "findings" in result.output
