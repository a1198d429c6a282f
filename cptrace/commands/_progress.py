"""A progress bar on stderr that appears only once an analysis has run for a second."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

SHOW_AFTER_S = 1.0
"""An analysis shorter than this prints no bar at all."""


class LateProgress:
    """Context manager yielding the ``progress(stage, fraction)`` callback of
    ``analyzers.analyze``; the bar (transient, stderr) starts on the first call after
    :data:`SHOW_AFTER_S` seconds. The caller checks that stderr is a terminal."""

    def __init__(self, show_after_s: float = SHOW_AFTER_S) -> None:
        self._show_after = show_after_s
        self._start = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    @property
    def shown(self) -> bool:
        """Whether the bar has appeared."""
        return self._bar is not None

    def __enter__(self) -> LateProgress:
        self._start = time.monotonic()
        return self

    def __call__(self, stage: str, fraction: float) -> None:
        if self._bar is None:
            if time.monotonic() - self._start < self._show_after:
                return
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(transient=True, console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task(stage, total=1.0)
        self._bar.update(self._task, completed=fraction, description=stage)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
