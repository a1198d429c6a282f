"""Where upload validation runs: a small supervised pool of processes, bounded in memory and time.

Parsing a large trace (GIL-bound JSON decoding, gzip) must never stall the API's event loop, and
a hostile upload must never take the server down with it. So each validation runs in one of
``ingest_workers`` long-lived ``service.limited_child.LimitedChild`` processes (uploads are
validated concurrently up to that many):

- memory: each process runs under ``RLIMIT_AS = validation_memory_limit_bytes``; an upload that
  needs more gets ``MemoryError`` in the child, answered 413, and the process is replaced;
- time: an upload still validating after ``validation_time_limit_s`` has its process killed
  and replaced, answered 413;
- death: a process that dies (SIGKILL, the OOM killer) fails only the upload it was working on
  (503, retry) and is restarted by the pool's monitor with a doubling backoff; after
  ``restart_max`` deaths inside ``restart_window_s`` the pool is ``failed`` and ``/health``
  answers 503. There is no ``BrokenProcessPool``: every process is its own slot.
- children end with the server (``follow_parent``).

The app's lifespan (``service.main``) calls ``start`` and ``shutdown``.
``ingest_workers = 0`` validates in a thread of the API process (tests; no limits).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from service.core.config import MiB, Settings
from service.core.errors import ApiError, PayloadTooLarge
from service.limited_child import CallOutOfMemory, CallTimedOut, ChildDied, LimitedChild
from service.messages import redact
from service.supervisor import ComponentState, RestartBudget

T = TypeVar("T")
log = logging.getLogger("cptrace.uploads")


class ValidationUnavailable(ApiError):
    """The validation process died under this upload, or the pool is down: retry later."""

    status = 503


class ValidationPool:
    """``size`` supervised validation processes; ``run`` blocks a thread until one answers."""

    def __init__(self, settings: Settings) -> None:
        self.size = settings.ingest_workers
        self.memory_limit = settings.validation_memory_limit_bytes
        self.time_limit = settings.validation_time_limit_s
        self.data_dir = settings.data_dir
        self.budget = RestartBudget.from_settings(settings)
        self.state = ComponentState.STARTING
        self.last_exit: str | None = None
        self._idle: queue.Queue[LimitedChild] = queue.Queue()
        self._slots: list[LimitedChild] = []
        self._dead = 0  # slots waiting for a restart
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = ThreadPoolExecutor(
            max_workers=self.size, thread_name_prefix="cptrace-ingest"
        )
        self._monitor = threading.Thread(
            target=self._watch, name="cptrace-ingest-monitor", daemon=True
        )

    # -- processes ------------------------------------------------------------------------------
    def start(self) -> None:
        for _ in range(self.size):
            self._idle.put(self._spawn())
        self.state = ComponentState.OK
        self._monitor.start()

    def _spawn(self) -> LimitedChild:
        slot = LimitedChild(memory_limit_bytes=self.memory_limit, name="cptrace-validate")
        with self._lock:
            self._slots.append(slot)
        return slot

    def _forget(self, slot: LimitedChild) -> None:
        slot.kill()
        with self._lock:
            if slot in self._slots:
                self._slots.remove(slot)

    def _replace(self, slot: LimitedChild) -> None:
        """A planned replacement (memory or time limit hit): no backoff, no restart counted."""
        self._forget(slot)
        if not self._stop.is_set():
            self._idle.put(self._spawn())

    def _crashed(self, slot: LimitedChild) -> None:
        """A process died on its own: the monitor restarts it after the backoff."""
        self.last_exit = slot.exit_description()
        self._forget(slot)
        with self._lock:
            self._dead += 1
        log.warning("an upload-validation process ended (%s)", self.last_exit)

    def _watch(self) -> None:
        """Find processes that died while idle, and restart every dead slot after a backoff."""
        while not self._stop.wait(0.2):
            with self._lock:
                gone = [s for s in self._slots if not s.alive()]
            for slot in gone:
                # Only idle slots are ours to judge; a busy one is judged by its request thread.
                if self._take_idle(slot):
                    self._crashed(slot)
            with self._lock:
                dead = self._dead
            if not dead or self.state is ComponentState.FAILED:
                continue
            delay = self.budget.next_delay()
            if delay is None:
                self.state = ComponentState.FAILED
                log.error("upload validation: too many process deaths; giving up")
                continue
            self.state = ComponentState.RESTARTING
            if self._stop.wait(delay):
                return
            with self._lock:
                self._dead -= 1
                still_dead = self._dead
            self._idle.put(self._spawn())
            if not still_dead:
                self.state = ComponentState.OK

    def _take_idle(self, slot: LimitedChild) -> bool:
        """Remove ``slot`` from the idle queue if it is there."""
        kept: list[LimitedChild] = []
        found = False
        while True:
            try:
                item = self._idle.get_nowait()
            except queue.Empty:
                break
            if item is slot:
                found = True
            else:
                kept.append(item)
        for item in kept:
            self._idle.put(item)
        return found

    # -- requests -------------------------------------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a validation process (blocking; called from ``_threads``)."""
        if self.state is ComponentState.FAILED:
            raise ValidationUnavailable("upload validation is down; the server needs a restart")
        slot = self._take(deadline=time.monotonic() + self.time_limit)
        if not slot.alive():
            self._crashed(slot)
            raise ValidationUnavailable("the upload-validation process had stopped; retry")
        started = time.monotonic()
        try:
            value = slot.call(fn, *args, time_limit_s=self.time_limit)
        except CallTimedOut:
            log.warning("upload validation passed its time limit (%g s)", self.time_limit)
            self._replace(slot)
            raise PayloadTooLarge(
                f"the upload takes longer than the validation time limit of {self.time_limit:g} s"
            ) from None
        except CallOutOfMemory:
            self._log_peak(slot, started)
            self._replace(slot)
            raise PayloadTooLarge(
                f"the upload needs more memory to validate than the limit of "
                f"{self.memory_limit // MiB} MiB"
            ) from None
        except ChildDied:
            self._crashed(slot)
            raise ValidationUnavailable(
                "the upload-validation process stopped while checking this upload; retry"
            ) from None
        except Exception as exc:  # what the check raised in the child: the upload's answer
            self._log_peak(slot, started)
            self._idle.put(slot)
            raise redact_exception(exc, self.data_dir) from None
        self._log_peak(slot, started)
        self._idle.put(slot)
        return value  # type: ignore[no-any-return]

    @staticmethod
    def _log_peak(slot: LimitedChild, started: float) -> None:
        peak = slot.peak_rss_bytes()
        log.info(
            "validated in %.2f s, validation process peak RSS %s MiB",
            time.monotonic() - started,
            "?" if peak is None else peak // MiB,
        )

    def _take(self, *, deadline: float) -> LimitedChild:
        """An idle process; waits (behind other uploads) until ``deadline``."""
        while True:
            if self.state is ComponentState.FAILED:
                raise ValidationUnavailable("upload validation is down; the server needs a restart")
            try:
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise ValidationUnavailable(
                        "no upload-validation process is free; retry"
                    ) from None

    def status(self) -> dict[str, Any]:
        with self._lock:
            alive = sum(1 for s in self._slots if s.alive())
        return {
            "state": self.state.value,
            "processes": self.size,
            "alive": alive,
            "restarts": self.budget.total,
            "last_exit": self.last_exit,
        }

    def healthy(self) -> bool:
        return self.state is ComponentState.OK and self.status()["alive"] >= self.size

    def shutdown(self) -> None:
        self._stop.set()
        self._threads.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            self._forget(slot)
        self.state = ComponentState.STOPPED


def redact_exception(exc: Exception, data_dir: Path) -> Exception:
    """The same exception with server paths taken out of its message."""
    if isinstance(exc, ApiError):
        exc.message = redact(exc.message, data_dir)
        exc.errors = [redact(str(e), data_dir) for e in exc.errors]
        exc.args = (exc.message,)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (redact(exc.args[0], data_dir), *exc.args[1:])
    return exc


def _thread_executor(app: Any) -> Executor:
    executor = getattr(app.state, "ingest_executor", None)
    if executor is None:
        executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cptrace-ingest")
        app.state.ingest_executor = executor
    return executor


def pool_of(app: Any) -> ValidationPool | None:
    """The app's validation pool (started on first use); None in thread mode."""
    settings: Settings = app.state.settings
    if settings.ingest_workers == 0:
        return None
    pool: ValidationPool | None = getattr(app.state, "validation_pool", None)
    if pool is None:
        pool = ValidationPool(settings)
        pool.start()
        app.state.validation_pool = pool
    return pool


def start(app: Any) -> None:
    """Start the validation processes now (app start-up), so /health sees them at once."""
    pool_of(app)


async def run_staging(app: Any, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a validation process (or the thread, in thread mode) and await it."""
    loop = asyncio.get_running_loop()
    pool = pool_of(app)
    if pool is None:
        return await loop.run_in_executor(_thread_executor(app), fn, *args)
    return await loop.run_in_executor(pool._threads, pool.run, fn, *args)


def shutdown(app: Any) -> None:
    """Stop the validation processes (at app shutdown)."""
    pool: ValidationPool | None = getattr(app.state, "validation_pool", None)
    if pool is not None:
        pool.shutdown()
        app.state.validation_pool = None
    executor = getattr(app.state, "ingest_executor", None)
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)
        app.state.ingest_executor = None
