"""The analysis worker: its own process, draining ``analysis_tasks`` one at a time.

Started by ``cptrace worker`` (or as a subprocess of ``cptrace serve``). It links the run's blobs
into a scratch directory under readable names (content decides the name, never the upload), calls
``analyzers.analyze``, and writes the report through ``service.analysis``. A heartbeat thread keeps
the lease alive while a long analysis runs; SIGTERM lets the current task finish, then exits.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzers.bundle import select_analysis_traces
from service import analysis
from service.core.config import Settings
from service.storage.blobs import BlobStore
from service.storage.database import connect

log = logging.getLogger("cptrace.worker")

_SUFFIX = {
    "nsys": ".sqlite",
    "nsys+gzip": ".sqlite.gz",
    "kineto": ".json",
    "kineto+gzip": ".json.gz",
}

AnalyzeFn = Callable[..., Any]


def _default_analyze() -> AnalyzeFn:
    from analyzers import analyze

    return analyze


class AnalysisWorker:
    """Claims analysis tasks and runs them; one task at a time per process."""

    def __init__(
        self, settings: Settings, *, analyze: AnalyzeFn | None = None, name: str | None = None
    ) -> None:
        self.settings = settings
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.blobs = BlobStore(settings.blob_dir, settings.tmp_dir)
        self.conn = connect(settings.db_path, busy_timeout_ms=settings.busy_timeout_ms)
        self._analyze = analyze
        self.stop = threading.Event()

    def run_forever(self) -> None:
        """Work until ``stop`` is set; idle polling every ``worker_poll_s``.

        Between tasks it also publishes the pull-request loop's finished batches (comments and
        commit statuses) when ``GITHUB_TOKEN`` is set: right after the analysis they wait for.
        """
        log.info("analysis worker %s started on %s", self.name, self.settings.db_path)
        publisher = _pr_publisher(self.settings)
        try:
            while not self.stop.is_set():
                busy = self.run_once()
                if publisher is not None:
                    publisher.maybe_tick()
                if not busy:
                    self.stop.wait(self.settings.worker_poll_s)
        finally:
            if publisher is not None:
                publisher.db.close()
        log.info("analysis worker %s stopped", self.name)

    def run_once(self) -> bool:
        """Claim and run one task; False when the queue was empty."""
        task = analysis.claim_analysis(
            self.conn,
            worker=self.name,
            lease_s=self.settings.analysis_lease_s,
            max_attempts=self.settings.analysis_max_attempts,
        )
        if task is None:
            return False
        self._run(task)
        return True

    def _run(self, task: analysis.ClaimedTask) -> None:
        scratch = self.settings.tmp_dir / f"analysis-{task.id}-{os.getpid()}"
        beat = _Heartbeat(self.settings, task)
        beat.start()
        started = time.perf_counter()
        try:
            files, manifest_raw = analysis.task_inputs(self.conn, task.run_id)
            paths = self._materialise(files, scratch)
            report = self._call_analyze(paths, manifest_raw, beat)
        except Exception as exc:
            log.warning("analysis of run %s failed: %s", task.run_id, exc)
            if _is_input_error(exc) or task.attempt >= self.settings.analysis_max_attempts:
                analysis.fail_analysis(self.conn, task, _describe(exc))
            else:  # maybe transient (disk, a lock): let the next claim retry it
                analysis.requeue_analysis(self.conn, task, _describe(exc))
        else:
            analysis.complete_analysis(self.conn, task, report, time.perf_counter() - started)
        finally:
            beat.stop()
            shutil.rmtree(scratch, ignore_errors=True)

    def _materialise(self, files: list[dict[str, Any]], scratch: Path) -> list[Path]:
        if not files:
            raise ValueError("the run has no trace files")
        files = select_analysis_traces(files, lambda f: f["format"] or "")
        scratch.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, f in enumerate(files):
            rank = "" if f["rank"] is None else f"-rank{f['rank']}"
            link = scratch / f"trace{i:03d}{rank}{_SUFFIX.get(f['format'] or '', '')}"
            os.symlink(self.blobs.path_for(f["sha256"]), link)
            paths.append(link)
        return paths

    def _call_analyze(self, paths: list[Path], manifest_raw: Any, beat: _Heartbeat) -> Any:
        from analyzers.manifest import parse_manifest

        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        analyze = self._analyze or _default_analyze()
        return analyze(paths, manifest=manifest, progress=beat.progress)

    def close(self) -> None:
        self.conn.close()


def _pr_publisher(settings: Settings) -> Any:
    """The pull-request loop's publisher, or None when GitHub is not configured."""
    from service.github_loop.publisher import Publisher
    from service.storage.database import Database

    db = Database(
        settings.db_path,
        busy_timeout_ms=settings.busy_timeout_ms,
        read_time_limit_ms=settings.read_time_limit_ms,
    )
    publisher = Publisher.from_env(db)
    if publisher is None:
        db.close()
    else:
        log.info("pull-request loop: publishing to %s", publisher.github.api_url)
    return publisher


def _is_input_error(exc: BaseException) -> bool:
    """Bad traces or manifests fail for good; retrying cannot help."""
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError

    return isinstance(exc, (TraceError, ManifestError))


def _describe(exc: BaseException) -> str:
    if _is_input_error(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _Heartbeat:
    """Extends the task lease on its own connection and publishes progress, throttled."""

    def __init__(self, settings: Settings, task: analysis.ClaimedTask) -> None:
        self.settings = settings
        self.task = task
        self.message = "analysing"
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cptrace-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def progress(self, *args: Any, **kwargs: Any) -> None:
        """Accepts whatever the pipeline reports (stage name, fraction, message)."""
        parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()]
        self.message = " ".join(parts) or "analysing"
        self._changed.set()

    def _loop(self) -> None:
        conn = connect(self.settings.db_path, busy_timeout_ms=self.settings.busy_timeout_ms)
        interval = min(self.settings.analysis_lease_s / 3, 5.0)
        try:
            while not self._stop.is_set():
                self._changed.wait(interval)
                self._changed.clear()
                if self._stop.is_set():
                    break
                analysis.record_progress(
                    conn, self.task, self.message, lease_s=self.settings.analysis_lease_s
                )
                self._stop.wait(0.25)  # at most ~4 progress writes a second
        except Exception as exc:  # a missed heartbeat only risks a requeue
            log.warning("heartbeat for task %s stopped: %s", self.task.id, exc)
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=10)
