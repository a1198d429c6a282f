"""Kineto steps whose ``gpu_user_annotation`` is missing are projected onto the GPU (issue 25).

The real open-world Kineto trace (3 ``ProfilerStep``s, each with its GPU annotation), once with
the annotation of ``ProfilerStep#3`` removed and once with all of them removed, as captures
with an incomplete annotation record look. A step without its annotation is measured over its
CPU range projected onto the GPU: from the first to the last GPU activity launched inside it
(recomputed here from the plain JSON), never into the next window; a note names it. On this
trace the projection measures the same GPU work as the annotation did.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analyzers.pipeline import analyze
from analyzers.report import AnalysisReport, WindowBasis
from tests.analyzers.test_step_window_real import Raw

DATA = Path(__file__).resolve().parents[1] / "data"
SDPA = DATA / "openworld" / "kineto_sdpa_single_gpu.json.gz"
STEPS = ("ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4")


@pytest.fixture(scope="module")
def full() -> AnalysisReport:
    return analyze(SDPA)


def _stripped(tmp: Path, names: set[str]) -> Path:
    doc = json.loads(gzip.decompress(SDPA.read_bytes()))
    before = len(doc["traceEvents"])
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if not (e.get("cat") == "gpu_user_annotation" and e["name"] in names)
    ]
    assert len(doc["traceEvents"]) == before - len(names)
    out = tmp / f"kineto_sdpa_without_{len(names)}.json.gz"
    out.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return out


def _projection(raw: Raw, cpu: tuple[int, int], limit: int | None) -> tuple[int, int]:
    """First start to last end of the activities launched in the CPU range, up to ``limit``."""
    lo, hi = cpu
    launched = [
        (s, e)
        for s, e, corr in raw.activities
        if corr is not None and corr in raw.launch_at and lo <= raw.launch_at[corr] <= hi
    ]
    first, last = min(s for s, _ in launched), max(e for _, e in launched)
    return first, last if limit is None else max(first, min(last, limit))


@pytest.mark.parametrize("removed", [{"ProfilerStep#3"}, set(STEPS)], ids=["one", "all"])
def test_steps_without_annotation_are_projected(
    removed: set[str], full: AnalysisReport, tmp_path: Path
) -> None:
    path = _stripped(tmp_path, removed)
    raw = Raw(path)
    report = analyze(path)
    steps = [t for t in report.window_timelines if t.window == "ProfilerStep"]
    annotated = [t for t in full.window_timelines if t.window == "ProfilerStep"]
    assert [t.name for t in steps] == list(STEPS)
    for i, (t, a) in enumerate(zip(steps, annotated, strict=True)):
        if t.name not in removed:
            assert t.basis is WindowBasis.GPU_ANNOTATION
            assert (t.start_ns, t.end_ns) == (a.start_ns, a.end_ns)
            continue
        assert t.basis is WindowBasis.GPU_PROJECTION
        limit = steps[i + 1].start_ns if i + 1 < len(steps) else None
        assert (t.start_ns, t.end_ns) == _projection(raw, (t.cpu_start_ns, t.cpu_end_ns), limit)
        # the same GPU work as the annotation measured (it opens 1 ns before the first kernel)
        assert t.busy_ns == a.busy_ns and 0 <= t.start_ns - a.start_ns <= 1
        assert t.end_ns == a.end_ns
    (note,) = [n for n in report.notes if "without a usable GPU annotation" in n]
    assert f"{len(removed)} of 3 'ProfilerStep' step(s)" in note
    assert all(name in note for name in removed)
    for step in report.step_accounts:
        assert sum(p.time_ns for p in step.parts) == step.span_ns
