"""Rank side of failure diagnosis: each rank says what it is doing in ``status/rank<r>.json``.

TE issue #1795 in practice: one rank raises (an FP8 GEMM on a token count that is not a multiple
of 8) while the others sit in an FSDP all-gather waiting for it; the job looks hung and the
exception is buried in one of N logs. Every rank therefore keeps a small status file that the
launcher's watchdog (``runners/profile/supervise.py``) reads:

* ``failed``: the uncaught exception (type, message, the innermost frame, traceback tail),
  written synchronously from ``sys.excepthook``/``threading.excepthook`` before the
  interpreter starts its (possibly hanging) shutdown;
* ``waiting``: the ``torch.distributed`` collective the rank has been inside for more than
  ``interval_s`` (the collectives are wrapped to set one variable; a daemon thread writes);
* ``running`` / ``exited``.

It also arms Python's ``faulthandler`` on ``SIGUSR1`` (:data:`STACKS_SIGNAL`): the watchdog sends
it to every rank before it stops a failed or hung job, and each rank writes the Python stack of
every thread to ``stacks_rank<r>.txt`` beside its status file (from the signal handler, in C, so
a rank blocked inside a collective, or holding the GIL, answers too). A rank the launcher cannot
signal (its own pid namespace) is asked by a request file instead, which the status thread
answers with ``faulthandler.dump_traceback``.

Nothing here reads environment variables other than the rank and the status directory.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from runners.profile.probe import rank_from_environment
from runners.profile.probe.hooks import when_imported

STATUS_ENV = "CPTRACE_STATUS_DIR"
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send", "recv",
)
TRACEBACK_LINES = 30
STACKS_SIGNAL = signal.SIGUSR1
"""The signal on which every rank dumps its threads' Python stacks (``faulthandler``)."""


def stacks_path(directory: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its stacks when asked (the launcher reads it)."""
    return directory / f"stacks_rank{rank}.txt"


def stacks_request_path(directory: Path, rank: int) -> Path:
    """The file whose appearance asks rank ``rank`` for its stacks: for a rank the launcher
    cannot signal (a job in a sandbox with its own pid namespace)."""
    return directory / f"stacks_rank{rank}.request"


def exception_record(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> dict[str, Any]:
    """Type, message, innermost frame and the traceback tail of an exception (JSON-ready)."""
    frames = traceback.extract_tb(tb)
    where = None
    if frames:
        last = frames[-1]
        where = {"file": last.filename, "line": last.lineno, "function": last.name}
    text = "".join(traceback.format_exception(exc_type, exc, tb)).splitlines()
    return {
        "type": exc_type.__name__,
        "message": str(exc)[:2000],
        "where": where,
        "traceback": text[-TRACEBACK_LINES:],
    }


class RankReporter:
    """Keeps ``<directory>/rank<r>.json`` current for one process."""

    def __init__(self, directory: Path, rank: int, *, interval_s: float = 0.25) -> None:
        self.path = directory / f"rank{rank}.json"
        self.stacks = stacks_path(directory, rank)
        self.stacks_request = stacks_request_path(directory, rank)
        self._stacks_file: Any = None
        self.rank = rank
        self.interval_s = interval_s
        self.state = "running"
        self.collective: str | None = None
        self.collective_since = 0.0
        self.exception: dict[str, Any] | None = None
        self._written: tuple[object, ...] | None = None
        self._lock = threading.Lock()
        self.started = time.time()

    # -- status file ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "rank": self.rank,
            "pid": os.getpid(),
            "state": self.state,
            "updated_at": round(time.time(), 3),
        }
        if self.state == "waiting" and self.collective:
            record["collective"] = self.collective
            record["waiting_s"] = round(time.monotonic() - self.collective_since, 3)
        if self.exception is not None:
            record["exception"] = self.exception
        return record

    def write(self, *, force: bool = False) -> None:
        with self._lock:
            key = (self.state, self.collective, self.exception is not None)
            if not force and key == self._written:
                return
            self._written = key
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.snapshot()) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)

    # -- what the rank does ---------------------------------------------------------------
    def failed(self, exc_type: type[BaseException], exc: BaseException,
               tb: TracebackType | None) -> None:
        if self.exception is None:  # the first exception is the cause; later ones follow it
            self.exception = exception_record(exc_type, exc, tb)
        self.state = "failed"
        self.write(force=True)

    def _answer_stacks_request(self) -> None:
        if self._stacks_file is not None and self.stacks_request.exists():
            faulthandler.dump_traceback(file=self._stacks_file, all_threads=True)
            self.stacks_request.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.interval_s)
            self._answer_stacks_request()
            if self.state in ("failed", "exited"):
                continue
            name, since = self.collective, self.collective_since
            waiting = name is not None and time.monotonic() - since > self.interval_s
            self.state = "waiting" if waiting else "running"
            self.write(force=waiting)  # keep waiting_s current while it waits

    def _wrap_collective(self, fn: Any, name: str) -> Any:
        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if self.collective is not None:  # nested (barrier built on all_reduce): outer wins
                return fn(*args, **kwargs)
            self.collective, self.collective_since = name, time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.collective = None

        collective.__cptrace_status__ = True  # type: ignore[attr-defined]
        return collective

    def patch_distributed(self, module: ModuleType) -> None:
        """Wrap the synchronous collectives of ``torch.distributed`` (module attributes)."""
        for name in COLLECTIVES:
            fn = getattr(module, name, None)
            if fn is not None and not getattr(fn, "__cptrace_status__", False):
                setattr(module, name, self._wrap_collective(fn, name))

    def arm_stack_dump(self) -> None:
        """``faulthandler`` writes every thread's stack to :attr:`stacks` on STACKS_SIGNAL."""
        self.stacks.parent.mkdir(parents=True, exist_ok=True)
        # Kept open for the life of the process: faulthandler writes to its descriptor.
        self._stacks_file = self.stacks.open("w", encoding="utf-8")
        faulthandler.register(STACKS_SIGNAL, file=self._stacks_file, all_threads=True)

    def install(self) -> RankReporter:
        self.arm_stack_dump()
        previous_hook = sys.excepthook
        previous_thread_hook = threading.excepthook

        def excepthook(exc_type: type[BaseException], exc: BaseException,
                       tb: TracebackType | None) -> None:
            self.failed(exc_type, exc, tb)
            previous_hook(exc_type, exc, tb)

        def thread_hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
                self.failed(args.exc_type, args.exc_value, args.exc_traceback)
            previous_thread_hook(args)

        sys.excepthook = excepthook
        threading.excepthook = thread_hook
        atexit.register(self._at_exit)
        when_imported("torch.distributed", self.patch_distributed)
        self.write(force=True)
        threading.Thread(target=self._heartbeat, name="cptrace-rank-status", daemon=True).start()
        return self

    def _at_exit(self) -> None:
        if self.state != "failed":
            self.state = "exited"
            self.write(force=True)


_REPORTER: RankReporter | None = None


def install_from_environment() -> RankReporter | None:
    """Start reporting when ``$CPTRACE_STATUS_DIR`` is set (once per process)."""
    global _REPORTER
    directory = os.environ.get(STATUS_ENV)
    if not directory or _REPORTER is not None:
        return _REPORTER
    _REPORTER = RankReporter(Path(directory), rank_from_environment()).install()
    return _REPORTER


def reporter() -> RankReporter | None:
    return _REPORTER
