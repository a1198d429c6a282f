"""Supervision of the server's child processes: restart what dies, give up honestly.

The API process owns two kinds of children: the analysis worker (``service.worker``, started
when ``Settings.run_worker`` is on; ``WorkerSupervisor`` here) and the upload-validation
processes (``service.uploads_exec.ValidationPool``, built on ``service.limited_child``, which
uses this module's ``RestartBudget``, ``describe_exit`` and ``follow_parent``). The app's
lifespan (``service.main``) starts and stops both; this module imports neither. Each dead child
is restarted after a backoff that doubles; more than ``restart_max`` deaths inside
``restart_window_s`` and the component is ``failed``: it stays down and ``/health`` answers 503,
so an orchestrator replaces the server instead of it limping on.

Children end with the server: each one runs ``follow_parent`` (a thread that exits the process
when its parent is gone, whatever thread started it), and the worker additionally asks the
kernel for a parent-death signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.core.config import Settings
from service.storage.engine import AnyDatabase

log = logging.getLogger("cptrace.supervisor")

PARENT_ENV = "CPTRACE_WORKER_PARENT_PID"
"""Set for a supervised worker: the pid of the API process it belongs to."""

BACKOFF_MAX_S = 30.0


class ComponentState(StrEnum):
    """Where a supervised component stands."""

    STARTING = "starting"
    OK = "ok"
    RESTARTING = "restarting"
    FAILED = "failed"  # out of restarts: stays down, /health is 503
    STOPPED = "stopped"


class RestartBudget:
    """Bounded restarts with exponential backoff over a sliding window."""

    def __init__(self, *, max_restarts: int, window_s: float, backoff_s: float) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.deaths: deque[float] = deque()
        self.total = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> RestartBudget:
        return cls(
            max_restarts=settings.restart_max,
            window_s=settings.restart_window_s,
            backoff_s=settings.restart_backoff_s,
        )

    def next_delay(self, now: float | None = None) -> float | None:
        """Record a death; the delay before the restart, or None when out of restarts."""
        now = time.monotonic() if now is None else now
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.window_s:
            self.deaths.popleft()
        if len(self.deaths) > self.max_restarts:
            return None
        self.total += 1
        return min(self.backoff_s * 2 ** (len(self.deaths) - 1), BACKOFF_MAX_S)


def describe_exit(returncode: int | None) -> str:
    """``exit code 1`` / ``killed by SIGKILL`` (no pid: this reaches /health)."""
    if returncode is None:
        return "running"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def follow_parent(parent_pid: int, *, interval_s: float = 0.2) -> None:
    """In a child: exit at once when ``parent_pid`` is no longer our parent.

    A watchdog thread, not ``PR_SET_PDEATHSIG``: that signal fires when the *thread* that
    started the child ends, and request threads come and go.
    """
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="cptrace-follow-parent", daemon=True).start()


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` when the starting thread's process ends (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as ``CPTRACE_*`` variables, so a child process sees exactly these."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        env[f"CPTRACE_{name.upper()}"] = str(value)
    env["CPTRACE_RUN_WORKER"] = "false"  # a worker never starts workers
    return env


@dataclass
class WorkerStatus:
    """What ``/health`` shows of the supervised worker (no pid, no path)."""

    state: ComponentState
    alive: bool
    restarts: int
    last_exit: str | None
    started_at: float | None
    name: str | None  # the worker's name in worker_heartbeats (host:pid); never shown


STARTUP_GRACE_S = 60.0
"""How long a new worker may take to record its first heartbeat before it counts as hung."""


WORKER_MODULE = "service.worker"
"""What the supervisor runs (``python -m``) unless the app names another: the composition root
names ``cptrace.worker``, the same worker with the pages' after-store hook."""


class WorkerSupervisor:
    """Starts ``python -m <worker module>`` and keeps it running (bounded restarts)."""

    def __init__(self, settings: Settings, db: AnyDatabase, module: str = WORKER_MODULE) -> None:
        self.settings = settings
        self.module = module
        self.db = db  # the API's own: where the worker beats and holds its leases
        self.budget = RestartBudget.from_settings(settings)
        self.state = ComponentState.STARTING
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_exit: str | None = None
        self.started_at: float | None = None
        self._stop = threading.Event()
        # The thread that starts the worker also owns it: PR_SET_PDEATHSIG follows that thread.
        self._thread = threading.Thread(target=self._loop, name="cptrace-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _spawn(self) -> None:
        env = {**os.environ, **settings_env(self.settings), PARENT_ENV: str(os.getpid())}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "--data-dir", str(self.settings.data_dir)],
            env=env,
        )
        self.started_at = time.time()
        self.state = ComponentState.OK
        log.info("analysis worker started")

    def _loop(self) -> None:
        self._spawn()
        next_check = time.monotonic()
        while not self._stop.wait(0.2):
            assert self.proc is not None
            code = self.proc.poll()
            if code is None:
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + 1.0
                    self._kill_if_silent()
                continue
            self.last_exit = describe_exit(code)
            self._release_leases(self.proc.pid)
            delay = self.budget.next_delay()
            if delay is None:
                self.state = ComponentState.FAILED
                log.error(
                    "analysis worker ended (%s); %d restarts within %.0f s: giving up",
                    self.last_exit,
                    self.budget.max_restarts,
                    self.budget.window_s,
                )
                return
            self.state = ComponentState.RESTARTING
            log.warning("analysis worker ended (%s); restarting in %.1f s", self.last_exit, delay)
            if self._stop.wait(delay):
                return
            self._spawn()
        self._terminate()

    def _kill_if_silent(self) -> None:
        """A worker alive but silent past ``health_worker_stale_s`` (stopped with SIGSTOP, hung
        in the kernel) is killed, so the loop restarts it like one that died."""
        from service.storage.heartbeats import last_beat

        proc, started = self.proc, self.started_at
        stale_s = self.settings.health_worker_stale_s
        if proc is None or started is None or time.time() - started <= stale_s:
            return
        name = f"{socket.gethostname()}:{proc.pid}"
        try:
            beat = self.db.read(lambda c: last_beat(c, name))
        except Exception as exc:  # cannot tell: leave it to the next check
            log.warning("could not read the worker's heartbeat: %s", exc)
            return
        if beat is None:  # not beating yet: a slow start (imports on a loaded host) gets longer
            if time.time() - started <= max(3 * stale_s, STARTUP_GRACE_S):
                return
        elif time.time() - beat <= stale_s:
            return
        log.error("analysis worker silent for over %.0f s; killing it to restart it", stale_s)
        proc.kill()

    def _release_leases(self, pid: int) -> None:
        """The dead worker's tasks need not wait for their lease: expire it now, so the next
        claim requeues them (the attempt stays counted)."""
        from service.storage.tasks import release_worker_leases

        name = f"{socket.gethostname()}:{pid}"
        try:
            self.db.write(lambda c: release_worker_leases(c, worker=name))
        except Exception as exc:  # the lease still expires on its own
            log.warning("could not release the dead worker's leases: %s", exc)

    def _terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM lets the worker finish its current analysis; kill only if it will not stop."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)
        self._terminate()  # when the loop had already ended (failed) or never ran
        self.state = ComponentState.STOPPED

    def status(self) -> WorkerStatus:
        code = None if self.proc is None else self.proc.poll()
        alive = self.proc is not None and code is None
        # The monitor loop records an exit up to one poll interval late; a reader that already
        # sees the process dead reports how it ended, not the previous death (or none).
        last_exit = self.last_exit if code is None else describe_exit(code)
        name = None if self.proc is None else f"{socket.gethostname()}:{self.proc.pid}"
        return WorkerStatus(self.state, alive, self.budget.total, last_exit, self.started_at, name)


def start_worker(app: Any) -> None:
    """Lifespan start-up: the supervised analysis worker, when ``Settings.run_worker`` is on
    (``app.state.worker_module``: the module it runs, :data:`WORKER_MODULE` by default)."""
    settings: Settings = app.state.settings
    if settings.run_worker:
        module = getattr(app.state, "worker_module", WORKER_MODULE)
        supervisor = WorkerSupervisor(settings, app.state.db, module)
        supervisor.start()
        app.state.worker_supervisor = supervisor


def stop_worker(app: Any) -> None:
    """Lifespan shutdown: stop the worker (it finishes its current analysis)."""
    supervisor: WorkerSupervisor | None = getattr(app.state, "worker_supervisor", None)
    if supervisor is not None:
        supervisor.stop()
        app.state.worker_supervisor = None
