"""One limited child process: a spawned process under ``RLIMIT_AS`` that runs calls by deadline.

Both kinds of background work that parse untrusted traces run in such a child: the upload
check (``service.uploads_exec``: a pool of long-lived children, one call each at a time) and the
analysis (``service.analysis_exec``: one child per analysis). One pipe protocol serves both:

====================  =========================================================================
child -> parent       meaning
====================  =========================================================================
``PROGRESS, text``    a line of progress (only for a call made with ``progress=``)
``OK, value``         the call returned ``value``
``ERROR, exception``  the call raised (the exception itself, or a :class:`ChildError` in words
                      when it does not pickle)
``MEMORY, None``      the call ran out of its address space; the child exits after this reply
====================  =========================================================================

The parent's side, :meth:`LimitedChild.call`, turns the rest into exceptions of its own:
:class:`CallTimedOut` past the deadline (the child is killed), :class:`ChildDied` when the pipe
closes without a reply (SIGKILL, the OOM killer). Children end with the server
(``follow_parent``) and yield the CPU to request handling (``lower_priority``).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import pickle
import resource
import time
from collections.abc import Callable
from enum import StrEnum
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from service.supervisor import describe_exit, follow_parent

BACKGROUND_NICE = 10


class Reply(StrEnum):
    """The first element of every message from a child."""

    OK = "ok"
    ERROR = "error"
    MEMORY = "memory"
    PROGRESS = "progress"


class ChildError(RuntimeError):
    """An exception of the child that could not travel through the pipe, in words."""


class CallTimedOut(Exception):
    """The call was still running at its deadline; the child has been killed."""


class CallOutOfMemory(Exception):
    """The call needed more than the child's address-space limit; the child has exited."""


class ChildDied(Exception):
    """The child ended without answering; ``str()`` says how (``killed by SIGKILL``)."""


def lower_priority() -> None:
    """Background work (validation, analysis) yields the CPU to request handling."""
    with contextlib.suppress(OSError):
        os.nice(BACKGROUND_NICE)


def limit_memory(limit_bytes: int) -> None:
    """Cap this process's address space: allocations past it raise ``MemoryError``.

    BLAS thread pools reserve address space per core; a limited process uses one thread, so
    its reservation does not depend on the host's core count.
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return ChildError(f"{type(exc).__name__}: {exc}")
    return exc


def _child_main(
    conn: Connection, parent_pid: int, memory_limit: int, preload: tuple[str, ...]
) -> None:
    """Serve ``(fn, args, with_progress)`` calls one at a time until the pipe closes."""
    follow_parent(parent_pid)
    lower_priority()
    # The libraries load before the limit: it bounds what a call allocates, not the fixed cost
    # of mapping numpy and friends.
    for module in preload:
        importlib.import_module(module)
    limit_memory(memory_limit)

    def progress(text: str) -> None:
        conn.send((Reply.PROGRESS, text))

    while True:
        try:
            fn, args, with_progress = conn.recv()
        except (EOFError, OSError):
            return
        try:
            value = fn(*args, progress) if with_progress else fn(*args)
            reply: tuple[Reply, Any] = (Reply.OK, value)
        except MemoryError:
            conn.send((Reply.MEMORY, None))
            return  # the heap may be in any state: a fresh process takes over
        except Exception as exc:
            reply = (Reply.ERROR, _picklable(exc))
        conn.send(reply)


class LimitedChild:
    """A spawned process under ``memory_limit_bytes`` that runs module-level functions."""

    def __init__(self, *, memory_limit_bytes: int, name: str, preload: tuple[str, ...] = ()):
        # spawn, not fork: the API process has threads (writer, readers) a fork would copy in
        # whatever state they were in.
        ctx = multiprocessing.get_context("spawn")
        self.memory_limit_bytes = memory_limit_bytes
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main,
            args=(child, os.getpid(), memory_limit_bytes, preload),
            name=name,
            daemon=True,
        )
        self.process.start()
        child.close()

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        time_limit_s: float,
        progress: Callable[[str], None] | None = None,
    ) -> Any:
        """``fn(*args)`` in the child (``fn(*args, progress)`` when ``progress`` is given).

        :raises CallTimedOut: past ``time_limit_s`` (the child is killed)
        :raises CallOutOfMemory: the call hit the memory limit (the child has exited)
        :raises ChildDied: the child ended without an answer
        :raises Exception: what ``fn`` raised in the child
        """
        deadline = time.monotonic() + time_limit_s
        try:
            self.conn.send((fn, args, progress is not None))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.conn.poll(remaining):
                    self.kill()
                    raise CallTimedOut(f"still running after {time_limit_s:g} s")
                kind, value = self.conn.recv()
                if kind is Reply.PROGRESS and progress is not None:
                    progress(value)
                    continue
                break
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise ChildDied(describe_exit(self.process.exitcode)) from None
        if kind is Reply.OK:
            return value
        if kind is Reply.MEMORY:
            self.process.join(timeout=5)
            if self.process.is_alive():  # a low-priority child on a loaded machine can take
                self.kill()  # longer to exit by itself; SIGKILL needs none of its CPU time
            raise CallOutOfMemory(f"over {self.memory_limit_bytes} bytes")
        raise value

    def alive(self) -> bool:
        return self.process.is_alive()

    def exit_description(self) -> str:
        return describe_exit(self.process.exitcode)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        self.process.join(timeout=5)
        with contextlib.suppress(Exception):
            self.conn.close()

    def peak_rss_bytes(self) -> int | None:
        """VmHWM of the process (Linux), for logs and tests."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
