"""Rank side of ``cptrace profile``: the job's steps, every one of them timed.

A *step* is what the user said it is (``--step-function``): one call of a function named
``module:qualname`` (wrapped right after its module is imported), or, by default, the interval
between two ``torch.optim.Optimizer.step`` calls (a global post-hook, every optimizer class).
One piece of code finds the boundaries; its listeners are the step clock below and the PyTorch
profiler (``runners/profile/torchprof.py``), which therefore agree on what a step is.

The clock times *every* step, not only the profiled ones: a CUDA event pair on the current
stream when CUDA is initialised (read back lazily, never a synchronisation inside the loop), else
``time.perf_counter``. Each step also says whether the PyTorch profiler was recording during it
(its warm-up and active steps run with tracing on and are slower). The record,
``steps_rank<r>.json`` in ``$CPTRACE_STEPS``' directory, is rewritten at most every 2 s from a
step boundary and at exit, so a rank that is killed later keeps what it had; the launcher turns
it into the run's iteration times (``runners/profile/steptimes.py``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from runners.profile.probe import rank_from_environment
from runners.profile.probe.hooks import when_imported

STEPS_ENV = "CPTRACE_STEPS"
"""JSON ``{"out_dir": ..., "step_on": "optimizer" | "module:qualname"}``."""
OPTIMIZER_STEP = "optimizer"
WRITE_EVERY_S = 2.0
CUDA_EVENT = "cuda_event"
PERF_COUNTER = "perf_counter"

Listener = Callable[[], None]


@dataclass(slots=True)
class StepBoundaries:
    """Calls ``begin`` listeners when a step starts and ``end`` listeners when it ends.

    With the optimizer definition a boundary is both the end of one step and the start of the
    next; the first ``optimizer.step`` only starts step 0. The clock is read last when a step
    starts and first when it ends, so the listeners' own work (the profiler exporting a trace)
    is never inside a timed step.
    """

    step_on: str = OPTIMIZER_STEP
    begin: list[Listener] = field(default_factory=list)
    end: list[Listener] = field(default_factory=list)
    clock: StepClock | None = None
    recording: Callable[[], bool] = lambda: False
    """Whether the PyTorch profiler is tracing now (``runners/profile/torchprof.py`` sets it)."""
    _started: bool = False

    def on_begin(self) -> None:
        for listener in self.begin:
            listener()
        if self.clock is not None:
            self.clock.begin()

    def on_end(self) -> None:
        if self.clock is not None:
            self.clock.end(profiled=self.recording())
        for listener in self.end:
            listener()

    def boundary(self) -> None:
        if self._started:
            self.on_end()
        self._started = True
        self.on_begin()

    def install(self) -> StepBoundaries:
        """Hook the step definition into the job (post-import hooks: nothing imported now)."""
        if self.step_on == OPTIMIZER_STEP:
            def hook_optimizer(module: ModuleType) -> None:
                module.register_optimizer_step_post_hook(lambda *_: self.boundary())

            when_imported("torch.optim.optimizer", hook_optimizer)
            return self
        module_name, _, qualname = self.step_on.partition(":")
        if not module_name or not qualname:
            raise ValueError(f"step function {self.step_on!r}: expected module:qualname")
        when_imported(module_name, lambda m: self._wrap(m, qualname))
        return self

    def _wrap(self, module: ModuleType, qualname: str) -> None:
        owner: Any = module
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            self.on_begin()
            try:
                return original(*args, **kwargs)
            finally:
                self.on_end()

        setattr(owner, name, step)


class StepClock:
    """Times each step; keeps the samples of one process and writes them to its record."""

    def __init__(self, path: Path | None, rank: int, step_on: str) -> None:
        self.path = path
        self.rank = rank
        self.step_on = step_on
        self.ms: list[float] = []
        self.profiled: list[int] = []
        """Indices of steps during which the PyTorch profiler was recording."""
        self.clocks: dict[str, int] = {}
        self._pending: deque[tuple[Any, Any, bool]] = deque()
        self._start: tuple[str, Any] | None = None
        self._cuda_module: Any = None
        self._last_write = time.monotonic()
        self._lock = threading.Lock()

    def _cuda(self) -> Any:
        """``torch.cuda`` once the job initialised CUDA (then for good), else None."""
        if self._cuda_module is None:
            torch = sys.modules.get("torch")  # a step means torch is loaded; never import it
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_initialized():
                self._cuda_module = cuda
        return self._cuda_module

    def begin(self) -> None:
        cuda = self._cuda()
        if cuda is not None:
            event = cuda.Event(enable_timing=True)
            event.record()
            self._start = (CUDA_EVENT, event)
        else:
            self._start = (PERF_COUNTER, time.perf_counter())

    def end(self, *, profiled: bool = False) -> None:
        """The step ends; ``profiled``: the PyTorch profiler was tracing during it."""
        started, self._start = self._start, None
        if started is None:
            return
        kind, mark = started
        if kind == CUDA_EVENT:
            cuda = self._cuda()
            stop = cuda.Event(enable_timing=True)
            stop.record()
            self._pending.append((mark, stop, profiled))
            self._resolve(wait=False)
        else:
            self._add(PERF_COUNTER, (time.perf_counter() - mark) * 1e3, profiled)
        if time.monotonic() - self._last_write > WRITE_EVERY_S:
            self.write()

    def _add(self, clock: str, ms: float, profiled: bool) -> None:
        if profiled:
            self.profiled.append(len(self.ms))
        self.ms.append(round(ms, 4))
        self.clocks[clock] = self.clocks.get(clock, 0) + 1

    def _resolve(self, *, wait: bool) -> None:
        """Read back the CUDA event pairs that have completed (all of them when ``wait``)."""
        while self._pending:
            start, stop, profiled = self._pending[0]
            if wait:
                stop.synchronize()
            elif not stop.query():
                return
            self._pending.popleft()
            self._add(CUDA_EVENT, float(start.elapsed_time(stop)), profiled)

    def record(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "step_on": self.step_on,
            "clocks": dict(self.clocks),
            "ms": list(self.ms),
            "profiled": list(self.profiled),
        }

    def write(self, *, final: bool = False) -> None:
        if self.path is None:
            return
        with self._lock:
            if final:
                try:
                    self._resolve(wait=True)
                except Exception:  # a broken CUDA context at exit: keep what was resolved
                    self._pending.clear()
            self._last_write = time.monotonic()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.record()) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepsConfig:
    out_dir: Path
    step_on: str = OPTIMIZER_STEP

    def to_env(self) -> str:
        return json.dumps({"out_dir": str(self.out_dir), "step_on": self.step_on})

    @classmethod
    def from_env(cls, raw: str) -> StepsConfig:
        data = json.loads(raw)
        return cls(out_dir=Path(data["out_dir"]), step_on=str(data["step_on"]))


_BOUNDARIES: StepBoundaries | None = None
_CLOCK: StepClock | None = None


def boundaries_for(step_on: str) -> StepBoundaries:
    """This process's step boundaries, hooked into the job on first use (one definition per
    process: the clock and the profiler must count the same steps)."""
    global _BOUNDARIES
    if _BOUNDARIES is None:
        _BOUNDARIES = StepBoundaries(step_on).install()
    elif _BOUNDARIES.step_on != step_on:
        raise ValueError(f"steps are already {_BOUNDARIES.step_on!r}, not {step_on!r}")
    return _BOUNDARIES


def install(config: StepsConfig, rank: int | None = None) -> StepClock:
    """Time every step of this process (once per process)."""
    global _CLOCK
    if _CLOCK is not None:
        return _CLOCK
    rank = rank_from_environment() if rank is None else rank
    clock = StepClock(config.out_dir / f"steps_rank{rank}.json", rank, config.step_on)
    boundaries_for(config.step_on).clock = clock
    atexit.register(lambda: clock.write(final=True))
    _CLOCK = clock
    return clock


def install_from_environment() -> StepClock | None:
    raw = os.environ.get(STEPS_ENV)
    return install(StepsConfig.from_env(raw)) if raw else None

