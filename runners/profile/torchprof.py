"""``cptrace profile --torch`` in the child: the PyTorch profiler driven by the job's own steps.

The job is not edited, so there is no ``prof.step()`` in its loop: a *step* is one call of
``torch.optim.Optimizer.step`` (a global post-hook, every optimizer class) or of a function the
user names (``module:qualname``): the boundaries ``runners/profile/steps.py`` finds, the same
ones the step clock times. The profiler
starts at the first step boundary and follows ``schedule(wait, warmup, active)``; the active
steps are exported to ``kineto_rank<r>.json`` in the profile directory, one file per rank. If the
job fails (or exits) while steps are being recorded, what was recorded is exported then. While
the profiler runs, the line of each synchronizing CUDA call is recorded beside the trace
(``sync_rank<r>.json``, ``runners/profile/synclines.py``) unless ``sync_lines`` is off.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.profile import steps
from runners.profile.lean_start import without_inductor_import
from runners.profile.probe import rank_from_environment
from runners.profile.synclines import SyncLineRecorder

TORCH_PROFILE_ENV = "CPTRACE_TORCH_PROFILE"
OPTIMIZER_STEP = steps.OPTIMIZER_STEP


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchProfileConfig:
    out_dir: Path
    wait: int = 1
    warmup: int = 1
    active: int = 3
    step_on: str = OPTIMIZER_STEP
    """``optimizer`` or ``module:qualname`` of the function whose calls are the steps."""
    with_stack: bool = True
    record_shapes: bool = False
    sync_lines: bool = True
    """Record the line of each synchronizing CUDA call while profiling (CUDA's sync debug
    mode ``warn``; nothing on CPU)."""

    def to_env(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "out_dir": str(self.out_dir)})

    @classmethod
    def from_env(cls, raw: str) -> TorchProfileConfig:
        data = json.loads(raw)
        return cls(**{**data, "out_dir": Path(data["out_dir"])})


class StepProfiler:
    """Starts, steps and exports ``torch.profiler.profile`` from step-boundary callbacks."""

    def __init__(self, config: TorchProfileConfig, rank: int) -> None:
        self.config = config
        self.rank = rank
        self.prof: Any = None
        self.done = False
        self.exported: Path | None = None
        self._idle: Any = None
        """``ProfilerAction.NONE``, bound when the profiler starts (a step reads it)."""
        self.syncs: SyncLineRecorder | None = None
        self._lock = threading.Lock()

    def recording(self) -> bool:
        """Whether the profiler is tracing now (its warm-up and active steps)."""
        prof = self.prof
        if prof is None or self.done:
            return False
        return bool(prof.current_action != self._idle)

    @property
    def total_steps(self) -> int:
        return self.config.wait + self.config.warmup + self.config.active

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

        self._idle = ProfilerAction.NONE
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        c = self.config
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=c.wait, warmup=c.warmup, active=c.active, repeat=1),
            on_trace_ready=self._export,
            with_stack=c.with_stack,
            record_shapes=c.record_shapes,
        )
        with without_inductor_import():
            self.prof.start()
        if c.sync_lines:
            self.syncs = SyncLineRecorder(c.out_dir, self.rank)
            self.syncs.start()

    def _export(self, prof: Any) -> None:
        target = self.config.out_dir / f"kineto_rank{self.rank}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(target))
        self.exported = target

    def step(self) -> None:
        """One step boundary of the job."""
        with self._lock:
            if self.done:
                return
            if self.prof is None:
                self._start()
                return
            with without_inductor_import():
                self.prof.step()
            if self.prof.step_num >= self.total_steps:
                self._finish()

    def _finish(self) -> None:
        if self.prof is not None and not self.done:
            self.done = True
            if self.syncs is not None:  # warn mode off first: the export must not warn
                self.syncs.stop()
            self.prof.stop()  # exports when it stops inside the active steps

    def finish(self) -> None:
        """Stop now (exit or failure): recorded steps are exported, nothing else happens."""
        with self._lock:
            self._finish()


def install(config: TorchProfileConfig, rank: int | None = None) -> StepProfiler:
    profiler = StepProfiler(config, rank_from_environment() if rank is None else rank)
    boundaries = steps.boundaries_for(config.step_on)
    # optimizer: every boundary (the first starts the profiler); a function: after each call
    (boundaries.begin if config.step_on == OPTIMIZER_STEP else boundaries.end).append(
        profiler.step
    )
    boundaries.recording = profiler.recording
    previous_hook = sys.excepthook

    def excepthook(*exc: Any) -> None:
        profiler.finish()
        previous_hook(*exc)

    sys.excepthook = excepthook
    atexit.register(profiler.finish)
    return profiler


def install_from_environment() -> StepProfiler | None:
    raw = os.environ.get(TORCH_PROFILE_ENV)
    return install(TorchProfileConfig.from_env(raw)) if raw else None
