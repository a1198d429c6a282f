"""``cptrace profile --torch`` in the child: the line of the user's code behind each CUDA sync.

A Kineto ``python_function`` event names its frame by the line the tracer first saw (a
function's ``def`` line), never the line running at the call, so the trace alone points a sync
at ``train.py:6 in check_finite`` when the ``.item()`` is on line 7. The profiled process knows
the line: while the PyTorch profiler traces (:class:`runners.profile.torchprof.StepProfiler`
starts and stops this recorder), ``torch.cuda.set_sync_debug_mode("warn")`` makes every
synchronizing CUDA call (``.item()``/``.cpu()`` of a CUDA tensor, ``torch.cuda.synchronize()``,
``nonzero``, a blocking copy) raise a Python warning, and a ``warnings.showwarning`` hook counts
each at the innermost frame of the user's code (the rule of :mod:`contracts.frames`, the one the
analysis uses for Kineto's stacks): its file, line, function and the function's first line, the
key the analysis joins with Kineto's frame. A filter with action ``always`` in front of the
others makes repeats count (Python's default shows a warning once per line). The hook prints
none of them: the job's output stays the job's (unless the job had turned warn mode on itself).
Syncs made with cptrace's hooks on the stack (the step clock reading its events) are not the
user's and are not counted.

On exit (or when the profiler stops), ``sync_rank<r>.json`` in the profile directory holds the
counts; ``runners/profile/run.py`` puts them into the manifest's ``sync_lines``
(``analyzers.manifest.SyncLines``). On a process without CUDA (a CPU run, or CUDA not initialised
when profiling starts) warn mode is never switched on: no CUDA sync to record, the record says
``no_cuda``, and the analysis keeps Kineto's line with its caveat.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from contracts.frames import is_library_frame, is_profile_hook_frame

SYNC_WARNING = "called a synchronizing CUDA operation"
"""The start of the message c10 warns with in sync debug mode ``warn``."""
MAX_SITES = 1000
"""Distinct call sites kept per rank (more are counted in ``dropped``)."""
MAX_MESSAGE_CHARS = 300
WARN = "warn"
NO_CUDA = "no_cuda"
_WARNING_MODULES = frozenset(("warnings", "_py_warnings"))
"""The machinery between the warning and the frame that raised it (``_py_warnings``: 3.14)."""
_USER, _LIBRARY, _OURS = 0, 1, 2
_kinds: dict[str, int] = {}
"""File name -> what its frames are, decided once per file (every sync walks the stack)."""


def _kind(filename: str) -> int:
    kind = _kinds.get(filename)
    if kind is None:
        if is_profile_hook_frame(filename):  # only these are cptrace's own: a job may well live
            kind = _OURS  # in cptrace's tree (its ``runners.models.train``, the tests' scripts)
        else:
            kind = _LIBRARY if is_library_frame(filename) else _USER
        _kinds[filename] = kind
    return kind


def user_site(frame: FrameType | None) -> tuple[str, int, str, int] | None:
    """``(file, line, function, first line)`` of the innermost frame of the user's code from
    ``frame`` outwards (the warnings machinery, torch and libraries skipped); None when
    cptrace's own code is on the way there (its sync, not the user's) or no user frame is."""
    while frame is not None:
        if frame.f_globals.get("__name__") not in _WARNING_MODULES:
            code = frame.f_code
            kind = _kind(code.co_filename)
            if kind == _OURS:
                return None
            if kind == _USER:
                return code.co_filename, frame.f_lineno, code.co_name, code.co_firstlineno
        frame = frame.f_back
    return None


class SyncLineRecorder:
    """Counts synchronizing CUDA calls per user call site between :meth:`start` and
    :meth:`stop`, and writes them to ``out_dir/sync_rank<rank>.json``."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.path = out_dir / f"sync_rank{rank}.json"
        self.rank = rank
        self.mode = NO_CUDA
        self.counts: Counter[tuple[str, int, str, int]] = Counter()
        self.messages: dict[tuple[str, int, str, int], str] = {}
        self.dropped = 0
        self.unplaced = 0
        """Sync warnings counted at no site: no user frame on the stack (a library's own
        thread), or cptrace's hooks made them."""
        self._lock = threading.Lock()
        self._cuda: Any = None
        self._previous_mode: Any = None
        self._previous_show: Any = None
        self._active = False

    def start(self, cuda: Any = None) -> None:
        """Switch warn mode on (only where CUDA is initialised) and hook the warnings.
        ``cuda``: the ``torch.cuda`` module to drive (default: the loaded torch's)."""
        if cuda is None:
            torch = sys.modules.get("torch")  # the profiler runs: torch is loaded; no import
            cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return  # CPU: no CUDA sync exists, nothing to record (the analysis falls back)
        self._cuda = cuda
        self._previous_mode = cuda.get_sync_debug_mode()
        self._set_mode(WARN)
        self._previous_show = warnings.showwarning
        warnings.showwarning = self._show
        warnings.filterwarnings("always", message=SYNC_WARNING, category=UserWarning)
        self.mode = WARN
        self._active = True

    def _set_mode(self, mode: Any) -> None:
        # torch warns that sync debug mode is a prototype each time it is switched on: cptrace's
        # doing, not the job's, so it stays out of the job's output
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._cuda.set_sync_debug_mode(mode)

    def _show(
        self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
        file: Any = None, line: str | None = None,
    ) -> None:
        text = str(message)
        if not (self._active and text.startswith(SYNC_WARNING)):
            self._previous_show(message, category, filename, lineno, file, line)
            return
        site = user_site(sys._getframe(1))
        with self._lock:
            if site is None:
                self.unplaced += 1
            elif site in self.counts or len(self.counts) < MAX_SITES:
                self.counts[site] += 1
                self.messages.setdefault(site, text[:MAX_MESSAGE_CHARS])
            else:
                self.dropped += 1
        if self._previous_mode:  # the job asked for warn mode itself: it sees its warnings
            self._previous_show(message, category, filename, lineno, file, line)

    def stop(self) -> None:
        """Restore the job's sync debug mode and ``showwarning``; write the record."""
        if self._active:
            self._active = False
            self._set_mode(self._previous_mode)
            if warnings.showwarning == self._show:
                warnings.showwarning = self._previous_show
            # The "always" filter stays: Python has no public way to take one filter back, and
            # with warn mode off the message it matches is never raised.
        self.write()

    def record(self) -> dict[str, Any]:
        with self._lock:
            sites = [
                {"file": f, "line": n, "function": fn, "first_line": first, "count": c,
                 "message": self.messages[(f, n, fn, first)]}
                for (f, n, fn, first), c in self.counts.most_common()
            ]
        return {"rank": self.rank, "mode": self.mode, "sites": sites, "dropped": self.dropped,
                "unplaced": self.unplaced}

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record()))
        os.replace(tmp, self.path)


def read_sync_files(directory: Path) -> list[dict[str, Any]]:
    """Every rank's record in ``directory`` (none when the directory is missing), by rank."""
    if not directory.is_dir():
        return []
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("sync_rank*.json"))]
    return sorted(records, key=lambda r: int(r["rank"]))


__all__ = ["NO_CUDA", "SYNC_WARNING", "WARN", "SyncLineRecorder", "read_sync_files", "user_site"]
