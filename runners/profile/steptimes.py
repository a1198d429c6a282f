"""Step-clock records (``steps_rank<r>.json``) -> the run's iteration times.

Every step of every rank was timed (``runners/profile/steps.py``). The run's iteration times
(``VariantManifest.iteration_ms``, what the analyzers and the gate compare) are the steps after
the first ``warmup`` ones, less the steps the PyTorch profiler was recording (its warm-up and
active steps run with tracing on, several-fold slower with Python stacks). The steps that were
left out, and why, go into the manifest's ``step_times`` beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runners.profile.supervise import read_rank_records


def read_step_files(directory: Path) -> dict[int, dict[str, Any]]:
    """rank -> step-clock record (a half-written file of a killed rank is skipped)."""
    return read_rank_records(directory, "steps_rank*.json")


def timed_steps(record: dict[str, Any], warmup: int) -> list[float]:
    """The record's step times after ``warmup`` steps, without the profiler's steps."""
    profiled = {int(i) for i in record.get("profiled", [])}
    samples = [float(x) for x in record.get("ms", [])]
    return [ms for i, ms in enumerate(samples) if i >= warmup and i not in profiled]


def iteration_times(
    records: dict[int, dict[str, Any]], warmup: int
) -> tuple[dict[int, list[float]], dict[str, Any]]:
    """(rank -> timed iteration ms, the manifest's ``step_times`` summary)."""
    times: dict[int, list[float]] = {}
    ranks: dict[str, Any] = {}
    for rank, record in sorted(records.items()):
        samples = timed_steps(record, warmup)
        if samples:
            times[rank] = samples
        ms = record.get("ms", [])
        ranks[str(rank)] = {
            "steps": len(ms),
            "timed": len(samples),
            "warmup": min(warmup, len(ms)),
            "profiled": len([i for i in record.get("profiled", []) if int(i) >= warmup]),
            "clocks": record.get("clocks", {}),
        }
    step_on = next((r.get("step_on") for r in records.values()), None)
    summary = {"step_on": step_on, "warmup_steps": warmup, "ranks": ranks}
    return times, summary
