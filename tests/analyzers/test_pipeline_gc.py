"""The analysis pauses Python's cycle collector and restores it as it found it, also on errors."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from testkit import DATA_DIR

from analyzers.errors import TraceError
from analyzers.pipeline import run_analysis

DATA = DATA_DIR
NSYS_SINGLE = DATA / "synthetic-h200x2" / "nsys_single.sqlite.gz"


@pytest.fixture
def collector_state() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_collector_paused_during_the_analysis_and_restored(collector_state: None) -> None:
    seen: list[bool] = []
    gc.enable()
    run_analysis(NSYS_SINGLE, progress=lambda stage, done: seen.append(gc.isenabled()))
    assert seen and not any(seen)  # every stage ran with the collector paused
    assert gc.isenabled()


def test_collector_left_off_when_the_caller_had_it_off(collector_state: None) -> None:
    gc.disable()
    run_analysis(NSYS_SINGLE)
    assert not gc.isenabled()


def test_collector_restored_after_a_failed_analysis(collector_state: None, tmp_path: Path) -> None:
    bad = tmp_path / "not_a_trace.json"
    bad.write_text('{"traceEvents": [')
    gc.enable()
    with pytest.raises(TraceError):
        run_analysis(bad)
    assert gc.isenabled()
