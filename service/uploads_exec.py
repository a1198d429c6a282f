"""Where upload validation runs: a small process pool, so parsing a large trace (GIL-bound JSON
decoding, gzip) never stalls the API's event loop or its read threads."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI

T = TypeVar("T")

BACKGROUND_NICE = 10


def _executor(app: FastAPI) -> Executor:
    executor = getattr(app.state, "ingest_executor", None)
    if executor is None:
        workers = app.state.settings.ingest_workers
        if workers == 0:
            executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cptrace-ingest")
        else:
            # spawn, not fork: the API process has threads (writer, readers) a fork would copy
            # in whatever state they were in.
            executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=lower_priority,
            )
        app.state.ingest_executor = executor
    return executor


def lower_priority() -> None:
    """Background work (validation, analysis) yields the CPU to request handling."""
    with contextlib.suppress(OSError):
        os.nice(BACKGROUND_NICE)


async def run_staging(app: FastAPI, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on the ingest executor and await it."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(app), fn, *args)


def shutdown(app: FastAPI) -> None:
    """Stop the ingest executor (at app shutdown)."""
    executor = getattr(app.state, "ingest_executor", None)
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)
        app.state.ingest_executor = None
