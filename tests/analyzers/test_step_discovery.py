"""Steps found without flags, and nsys steps projected onto the GPU (issue 25).

The real single-process nsys export of ``tests/data/synthetic-h200x2`` (20 iterations of a
helper range and a matmul) with NVTX ranges ``step 0`` .. ``step 18`` added around its
iterations (each from one iteration's helper range to the next): the export had no step
ranges, so it analysed as one whole-trace window. Expected figures come from SQL on the file.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from itertools import pairwise
from pathlib import Path

import pytest
from testkit import DATA_DIR

from analyzers.pipeline import run_analysis
from analyzers.report import WindowBasis
from analyzers.windows import NAMED_STEP

SINGLE = DATA_DIR / "synthetic-h200x2" / "nsys_single.sqlite.gz"
HELPER = "get_cu_seqlens_on_cp_rank"


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _with_ranges(tmp_path_factory.mktemp("steps") / "stepped.sqlite", "step {i}")


def _with_ranges(db: Path, name: str) -> Path:
    """The export with a range ``name`` (``{i}``: the iteration) around each iteration."""
    with gzip.open(SINGLE) as src, open(db, "wb") as out:
        shutil.copyfileobj(src, out)
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT start, globalTid FROM NVTX_EVENTS WHERE text = ? ORDER BY start", (HELPER,)
        ).fetchall()
        conn.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES "
            "(?, ?, 59, ?, ?)",
            [
                (start - 10, nxt - 20, name.format(i=i), tid)
                for i, ((start, tid), (nxt, _)) in enumerate(pairwise(rows))
            ],
        )
    return db


def _projection(db: Path) -> list[tuple[int, int, int, int]]:
    """(cpu start, cpu end, first activity start, last activity end) per step, from SQL."""
    with sqlite3.connect(db) as conn:
        steps = conn.execute(
            "SELECT start, end FROM NVTX_EVENTS WHERE eventType = 59 AND start IN (SELECT "
            "start - 10 FROM NVTX_EVENTS WHERE text = ?) AND text != ? ORDER BY start",
            (HELPER, HELPER),
        ).fetchall()
        out = []
        for lo, hi in steps:
            first, last = conn.execute(
                "SELECT min(a.start), max(a.end) FROM (SELECT start, end, correlationId FROM "
                "CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end, correlationId FROM "
                "CUPTI_ACTIVITY_KIND_MEMCPY) a JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON "
                "r.correlationId = a.correlationId WHERE r.start BETWEEN ? AND ?",
                (lo, hi),
            ).fetchone()
            out.append((lo, hi, first, last))
    return out


def test_step_names_people_use_are_steps() -> None:
    for name in ("step 3", "Step 3", "step_3", "iteration 12", "iter 4", "train_step",
                 "training_step 2", "Iteration#7"):
        assert NAMED_STEP.match(name), name
    for name in ("ProfilerStep#3", "optimizer.step", "stepper", "get_step_size", "aten::step"):
        assert not NAMED_STEP.match(name), name


def test_nvtx_steps_are_found_without_flags_and_said_so(stepped: Path) -> None:
    report = run_analysis(stepped).report
    steps = [w for w in report.windows if w.kind == "step"]
    assert len(steps) == 19 and {w.group for w in steps} == {"step"}
    (note,) = [n for n in report.notes if n.startswith("steps:")]
    assert "'step 0'" in note and "--step-pattern" in note
    assert report.iterations and report.iterations[0].n == 19


def test_step_pattern_still_overrides(stepped: Path) -> None:
    report = run_analysis(stepped, step_pattern=f"^{HELPER}$").report
    assert {w.group for w in report.windows if w.kind == "step"} == {HELPER}
    assert not [n for n in report.notes if n.startswith("steps:")]


def test_nsys_steps_are_projected_onto_the_gpu(stepped: Path) -> None:
    report = run_analysis(stepped).report
    timelines = sorted(
        (t for t in report.window_timelines if t.window == "step"), key=lambda t: t.start_ns
    )
    expected = _projection(stepped)
    assert len(timelines) == len(expected) == 19
    for i, (t, (lo, hi, first, last)) in enumerate(zip(timelines, expected, strict=True)):
        assert t.basis is WindowBasis.GPU_PROJECTION
        assert (t.cpu_start_ns, t.cpu_end_ns) == (lo, hi)  # the CPU range, beside it
        nxt = expected[i + 1][2] if i + 1 < len(expected) else last
        assert (t.start_ns, t.end_ns) == (first, min(last, nxt))
    assert any(t.start_ns > t.cpu_start_ns for t in timelines)  # the GPU runs behind the CPU


def test_a_repeated_top_level_range_is_the_step_failing_named_ones(tmp_path: Path) -> None:
    db = _with_ranges(tmp_path / "loop.sqlite", "train")
    report = run_analysis(db).report
    assert len([w for w in report.windows if w.kind == "step" and w.group == "train"]) == 19
    (note,) = [n for n in report.notes if n.startswith("steps:")]
    assert "'train'" in note and "repeated" in note


def test_a_catalogued_helper_repeated_is_not_the_step() -> None:
    """The helper ranges repeat 20 times on the launching thread: catalogued, never steps."""
    report = run_analysis(SINGLE).report
    assert [w.kind for w in report.windows] == ["trace"]
