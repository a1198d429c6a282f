"""The one phase timer: wall seconds per phase of an upload, its ``Server-Timing`` header.

The upload route times receive, stage and record; the staging (in a validation process) times
read, check and commit and the CPU of the whole. Both are this class; the route's header carries
the staging's phases under a ``stage-`` prefix, and the upload benchmark reads it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping


class PhaseTimer:
    """Laps of wall time, in the order they were taken; optionally the CPU time of the whole."""

    def __init__(self, *, cpu: bool = False) -> None:
        self.laps: dict[str, float] = {}
        self._cpu = time.process_time() if cpu else None
        self._started = self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the last lap (or the start) is ``phase``'s."""
        now = time.perf_counter()
        self.laps[phase] = now - self._mark
        self._mark = now

    def record(self, name: str, seconds: float) -> None:
        """A figure measured elsewhere (e.g. the wait for the disk) among the laps."""
        self.laps[name] = seconds

    def done(self) -> dict[str, float]:
        """The laps, plus ``cpu`` (this process's CPU seconds) when the timer counts it."""
        if self._cpu is not None:
            self.laps["cpu"] = time.process_time() - self._cpu
        return dict(self.laps)

    def server_timing(self, inner: Mapping[str, float] | None = None, *, prefix: str = "") -> str:
        """``receive;dur=1.2, ..., total;dur=9.9, stage-read;dur=...``: the laps, the total so
        far, then ``inner`` (another timer's ``done()``) under ``prefix``."""
        phases = dict(self.laps)
        phases["total"] = time.perf_counter() - self._started
        for name, seconds in (inner or {}).items():
            phases[f"{prefix}{name}"] = seconds
        return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in phases.items())
