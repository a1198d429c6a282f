"""The analysis worker: its own process, draining ``analysis_tasks`` one at a time.

Started by ``cptrace worker`` or ``python -m service.worker`` (the API's supervisor starts it so,
see ``service.supervisor``). It links the run's blobs into a scratch directory under readable
names (content decides the name, never the upload), runs ``analyzers.analyze`` in a child
process under a time and memory limit (``service.analysis_exec``), checks that the report
loads back, and writes it through ``service.analysis``. A run of several trace files is split
into one queue task per file and a merge task (``service.storage.tasks``,
``service.rank_exec``), which this and any other workers share: the part each rank task writes
goes to the blob store, the merge fetches the parts, and the parts are deleted once the run is
analysed or failed. A worker runs up to ``analysis_rank_workers`` rank tasks at once (a thread
and a limited child each), other tasks one at a time. A heartbeat thread keeps the
lease alive while a long analysis runs; another records in ``worker_heartbeats`` that the
worker is alive (what ``/health`` reads). SIGTERM lets the current task finish, then exits.
Failure reasons and the report's sources name the user's files, never the scratch paths.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from analyzers.bundle import select_analysis_traces
from analyzers.readers import TraceFormat, TraceInput
from service import analysis
from service.analysis_exec import AnalysisFailed, run_isolated, validate_report
from service.auth import now_iso
from service.core.config import Settings, SettingsError
from service.messages import redact
from service.rank_exec import run_merge_stage, run_rank_stage
from service.storage import heartbeats, tasks
from service.storage.blobs import open_blobs
from service.storage.engine import (
    DATABASE_ERRORS,
    AnyDatabase,
    Conn,
    database_fault,
    fault_reason,
    shown_url,
)
from service.storage.tasks import TaskKind

log = logging.getLogger("cptrace.worker")

_SUFFIX = {
    "nsys": ".sqlite",
    "nsys+gzip": ".sqlite.gz",
    "kineto": ".json",
    "kineto+gzip": ".json.gz",
}

AnalyzeFn = Callable[..., Any]
StoredHook = Callable[[AnyDatabase, int], None]
"""Called with the worker's database and the run's id once a run's report is stored: what
the composition root (``cptrace.worker``) builds ahead of the pages (``service`` imports none)."""
_TRACE_FORMATS: dict[str, TraceFormat] = {"kineto": "kineto", "nsys": "nsys"}


def trace_input(stored: dict[str, Any], link: Path) -> TraceInput | Path:
    """A stored run file as the analysis' typed input: its format and gzip from the
    ``format`` column (``kineto+gzip``, as ingest found them), its uploaded name as the label
    (the report names the user's file, not the scratch link). A saved report, or a row
    without a format, stays a path for the analysis to sniff."""
    fmt, _, gzip = (stored["format"] or "").partition("+")
    found = _TRACE_FORMATS.get(fmt)
    if found is None:
        return link
    return TraceInput(
        path=link,
        format=found,
        gzipped=gzip == "gzip",
        rank=stored["rank"],
        label=stored["name"],
    )


class AnalysisWorker:
    """Claims analysis tasks and runs them; one task at a time per process."""

    def __init__(
        self, settings: Settings, *, analyze: AnalyzeFn | None = None, name: str | None = None,
        on_stored: StoredHook | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.blobs = open_blobs(settings.blob_location, settings.tmp_dir)
        from service.main import open_database

        self.db: AnyDatabase = open_database(settings)
        self._analyze = analyze
        self.on_stored = on_stored
        self.stop = threading.Event()

    def run_forever(self) -> None:
        """Work until ``stop`` is set; idle polling every ``worker_poll_s``.

        Between tasks it also publishes the pull-request loop's finished batches (comments and
        commit statuses) when ``GITHUB_TOKEN`` is set: right after the analysis they wait for.
        """
        url = self.settings.database_url
        where = shown_url(url) if url else str(self.settings.db_path)
        log.info("analysis worker %s started on %s", self.name, where)
        host = socket.gethostname()
        orphans = self.db.write(lambda c: analysis.expire_orphaned_leases(c, host=host))
        if orphans:
            log.warning("tasks %s: their worker on this host is gone; requeued now", orphans)
        self._reclaim(None)  # parts of analyses that ended while no worker could delete them
        alive = _Alive(self.settings, self.db, self.name)
        alive.start()
        publisher = _pr_publisher(self.db)
        slots = [
            threading.Thread(target=self._rank_slot, name=f"cptrace-rank-{i}", daemon=True)
            for i in range(1, self.settings.analysis_rank_workers)
        ]
        for slot in slots:
            slot.start()
        lost: str | None = None  # the database's failure while it lasts, said once
        try:
            while not self.stop.is_set():
                try:
                    busy = self.run_once()
                    if publisher is not None:
                        publisher.maybe_tick()
                except DATABASE_ERRORS as exc:  # a lost or busy database pauses, never ends us
                    if database_fault(exc) is None:  # a bad statement is a bug: end loudly
                        raise
                    if lost is None:
                        lost = fault_reason(exc)
                        log.warning("database unavailable: %s; retrying until it answers", lost)
                    self.stop.wait(max(self.settings.worker_poll_s, 1.0))
                    continue
                if lost is not None:
                    log.info("database answers again; claiming tasks")
                    lost = None
                if not busy:
                    self.stop.wait(self.settings.worker_poll_s)
        finally:
            self.stop.set()  # the slots end after their current task too
            for slot in slots:
                slot.join()
            alive.stop()
        log.info("analysis worker %s stopped", self.name)

    def _rank_slot(self) -> None:
        """Another rank task at a time beside the main loop: a run's files use up to
        ``analysis_rank_workers`` cores of this host (and any other worker's)."""
        while not self.stop.is_set():
            try:
                busy = self.run_once(kinds=(TaskKind.RANK,))
            except DATABASE_ERRORS as exc:  # the main loop says so; this slot waits
                if database_fault(exc) is None:
                    log.exception("rank task slot: a database error that is no fault to wait out")
                else:
                    log.debug("rank task slot: %s", fault_reason(exc))
                busy = False
            if not busy:
                self.stop.wait(self.settings.worker_poll_s)

    def run_once(self, kinds: tuple[TaskKind, ...] | None = None) -> bool:
        """Claim and run one task (of ``kinds``: default any); False when none was queued."""
        task = self.db.write(
            lambda c: analysis.claim_analysis(
                c,
                worker=self.name,
                lease_s=self.settings.analysis_lease_s,
                max_attempts=self.settings.analysis_max_attempts,
                kinds=kinds,
            )
        )
        if task is None:
            return False
        self._run(task)
        return True

    def _run(self, task: analysis.ClaimedTask) -> None:
        scratch = self.settings.tmp_dir / f"analysis-{task.id}-{os.getpid()}"
        beat = _Heartbeat(self.settings, self.db, task)
        beat.start()
        started = time.perf_counter()
        labels: dict[str, str] = {}
        named: list[str] = []  # a rank task's file, named in its failure
        try:
            files, manifest_raw = self.db.read(lambda c: analysis.task_inputs(c, task.run_id))
            report: Any = None  # a rank task, or a run split into rank tasks: none to store
            if task.kind is TaskKind.RANK:
                self._run_rank(task, files, scratch, labels, named, beat)
            elif task.kind is TaskKind.MERGE:
                report = self._run_merge(task, manifest_raw, scratch, labels, beat)
            else:
                inputs = self._materialise(files, scratch, labels)
                report = self._analyse_run(task, inputs, manifest_raw, beat)
        except Exception as exc:
            log.warning("analysis of run %s failed: %s", task.run_id, exc)
            reason = redact(_describe(exc), self.settings.data_dir, labels)
            if named:
                reason = f"{named[0]}: {reason}"
            if _is_input_error(exc) or task.attempt >= self.settings.analysis_max_attempts:
                self.db.write(lambda c: analysis.fail_analysis(c, task, reason))
                self._reclaim(task.parent_id if task.kind is TaskKind.RANK else task.id)
            else:  # maybe transient (disk, a lock): let the next claim retry it
                self.db.write(lambda c: analysis.requeue_analysis(c, task, reason))
        else:
            if report is not None:
                took = time.perf_counter() - started
                stored = self.db.write(lambda c: analysis.complete_analysis(c, task, report, took))
                if task.kind is TaskKind.MERGE:  # the parts first: the page can be built later
                    self._reclaim(task.id)
                if stored and self.on_stored is not None:
                    self._after_store(task.run_id)
        finally:
            beat.stop()
            shutil.rmtree(scratch, ignore_errors=True)

    def _analyse_run(
        self,
        task: analysis.ClaimedTask,
        inputs: list[TraceInput | Path],
        manifest_raw: Any,
        beat: _Heartbeat,
    ) -> Any:
        """The run in one process; or, several trace files of enough bytes, split into rank
        tasks and a merge task (None: nothing to store yet)."""
        typed = [p for p in inputs if isinstance(p, TraceInput)]
        stored = sum(p.path.stat().st_size for p in typed)
        if (
            self._analyze is None
            and len(typed) > 1
            and len(typed) == len(inputs)
            and stored >= self.settings.analysis_per_rank_min_bytes
        ):
            log.info("analysing %d files per rank as %d queue tasks", len(typed), len(typed))
            self.db.write(lambda c: tasks.split_into_ranks(c, task, len(typed)))
            return None
        return self._call_analyze(inputs, manifest_raw, beat)

    def _run_rank(
        self,
        task: analysis.ClaimedTask,
        files: list[dict[str, Any]],
        scratch: Path,
        labels: dict[str, str],
        named: list[str],
        beat: _Heartbeat,
    ) -> None:
        """One file of the run read and attributed; its part stored as a blob for the merge."""
        chosen = self._selected(files)
        part = task.part if task.part is not None else -1
        if not 0 <= part < len(chosen):
            raise ValueError(f"rank task for file {part} of a run of {len(chosen)} files")
        row = chosen[part]
        named.append(row["name"] if row["rank"] is None else f"rank {row['rank']} ({row['name']})")
        beat.progress(f"ranks: reading and attributing file {part + 1} of {len(chosen)}")
        scratch.mkdir(parents=True, exist_ok=True)
        item = self._link(row, part, scratch, labels)
        if not isinstance(item, TraceInput):
            raise ValueError(f"{row['name']}: not a trace file of a known format")
        blob = scratch / "part.npz"
        run_rank_stage(
            item,
            files=len(chosen),
            part=blob,
            time_limit_s=self.settings.analysis_time_limit_s,
            memory_limit_bytes=self.settings.analysis_memory_limit_bytes,
            max_decompressed_bytes=self.settings.max_decompressed_bytes,
        )
        with blob.open("rb") as fh:
            stored = self.blobs.put_file(fh)
        if not self.db.write(lambda c: tasks.complete_rank(c, task, stored.sha256)):
            # the claim was lost, or the run's analysis ended: nobody will merge this part
            # (its bytes name this task's scratch folder: no other task's part shares them)
            self.blobs.delete(stored.sha256)

    def _run_merge(
        self,
        task: analysis.ClaimedTask,
        manifest_raw: Any,
        scratch: Path,
        labels: dict[str, str],
        beat: _Heartbeat,
    ) -> Any:
        """The run's parts fetched from the blob store and merged into its report."""
        digests = self.db.read(lambda c: tasks.part_blobs(c, task))
        beat.progress(f"merging {len(digests)} files")
        scratch.mkdir(parents=True, exist_ok=True)
        limit = max(self.settings.max_decompressed_bytes, self.settings.max_upload_bytes)
        parts = []
        for i, digest in enumerate(digests):
            link = scratch / f"part{i:04d}.npz"
            self.blobs.materialise(digest, link, limit=limit)
            labels[self.blobs.describe(digest)] = f"the part of file {i + 1}"
            parts.append(link)
        labels[str(scratch)] = "the run"
        return run_merge_stage(
            parts,
            manifest_raw,
            time_limit_s=self.settings.analysis_time_limit_s,
            memory_limit_bytes=self.settings.analysis_memory_limit_bytes,
        )

    def _after_store(self, run_id: int) -> None:
        """The stored hook; its failure costs the run nothing (what it builds ahead, the
        pages build at their first view)."""
        assert self.on_stored is not None
        try:
            self.on_stored(self.db, run_id)
        except Exception:
            log.exception("run %s: the after-store hook failed; pages build when viewed", run_id)

    def _reclaim(self, merge_id: int | None) -> None:
        """Delete the part blobs of analyses that ended (``merge_id``'s, or every one's)."""
        try:
            digests = self.db.write(lambda c: tasks.reclaim_parts(c, parent_id=merge_id))
            for digest in digests:
                self.blobs.delete(digest)
        except Exception as exc:  # left for the next worker start or blob sweep
            log.warning("part blobs not reclaimed: %s", exc)

    def _selected(self, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The run's trace files the analysis reads, in its order (rank tasks index them)."""
        if not files:
            raise ValueError("the run has no trace files")
        return select_analysis_traces(files, lambda f: f["format"] or "")

    def _link(
        self, f: dict[str, Any], i: int, scratch: Path, labels: dict[str, str]
    ) -> TraceInput | Path:
        """The ``i``-th analysed file under a readable name in ``scratch``, typed."""
        rank = "" if f["rank"] is None else f"-rank{f['rank']}"
        link = scratch / f"trace{i:03d}{rank}{_SUFFIX.get(f['format'] or '', '')}"
        # a local blob is linked; an S3 blob is streamed into the scratch folder (removed
        # after the task), bounded by the caps every stored blob passed at upload
        limit = max(self.settings.max_decompressed_bytes, self.settings.max_upload_bytes)
        self.blobs.materialise(f["sha256"], link, limit=limit)
        labels[str(link)] = f["name"]  # error messages name the uploaded file
        labels[self.blobs.describe(f["sha256"])] = f["name"]
        return trace_input(f, link)

    def _materialise(
        self, files: list[dict[str, Any]], scratch: Path, labels: dict[str, str]
    ) -> list[TraceInput | Path]:
        chosen = self._selected(files)
        scratch.mkdir(parents=True, exist_ok=True)
        paths = [self._link(f, i, scratch, labels) for i, f in enumerate(chosen)]
        labels[str(scratch)] = "the run"
        return paths

    def _call_analyze(
        self, paths: list[TraceInput | Path], manifest_raw: Any, beat: _Heartbeat
    ) -> Any:
        from analyzers.manifest import parse_manifest

        if self._analyze is None:  # production: a child process under limits
            return run_isolated(
                paths,
                manifest_raw,
                time_limit_s=self.settings.analysis_time_limit_s,
                memory_limit_bytes=self.settings.analysis_memory_limit_bytes,
                max_decompressed_bytes=self.settings.max_decompressed_bytes,
                progress=beat.progress,
            )
        manifest = parse_manifest(manifest_raw, source="manifest.json") if manifest_raw else None
        report = self._analyze(paths, manifest=manifest, progress=beat.progress)
        return validate_report(report.model_dump_json())

    def close(self) -> None:
        self.db.close()


def _pr_publisher(db: AnyDatabase) -> Any:
    """The pull-request loop's publisher (on the worker's database), or None when GitHub is
    not configured."""
    from service.github_loop.publisher import Publisher

    publisher = Publisher.from_env(db)
    if publisher is not None:
        log.info("pull-request loop: publishing to %s", publisher.github.api_url)
    return publisher


def _is_input_error(exc: BaseException) -> bool:
    """Bad traces or manifests fail for good; retrying cannot help."""
    from analyzers.errors import TraceError
    from analyzers.manifest import ManifestError

    if isinstance(exc, AnalysisFailed):
        return exc.final
    return isinstance(exc, (TraceError, ManifestError))


def _describe(exc: BaseException) -> str:
    if _is_input_error(exc) or isinstance(exc, AnalysisFailed):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _Heartbeat:
    """Extends the task lease from its own thread and publishes progress, throttled."""

    def __init__(self, settings: Settings, db: AnyDatabase, task: analysis.ClaimedTask) -> None:
        self.settings = settings
        self.db = db
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
        interval = min(self.settings.analysis_lease_s / 3, 5.0)
        lease_s = self.settings.analysis_lease_s
        try:
            while not self._stop.is_set():
                self._changed.wait(interval)
                self._changed.clear()
                if self._stop.is_set():
                    break
                message = self.message

                def beat(conn: Conn, message: str = message) -> None:
                    analysis.record_progress(conn, self.task, message, lease_s=lease_s)

                self.db.write(beat)
                self._stop.wait(0.25)  # at most ~4 progress writes a second
        except Exception as exc:  # a missed heartbeat only risks a requeue
            log.warning("heartbeat for task %s stopped: %s", self.task.id, exc)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=10)


class _Alive:
    """Records in ``worker_heartbeats`` every ``worker_heartbeat_s`` that this worker lives."""

    def __init__(self, settings: Settings, db: AnyDatabase, name: str) -> None:
        self.settings = settings
        self.db = db
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cptrace-alive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat(self, conn: Conn, state: str) -> None:
        heartbeats.record_beat(
            conn, name=self.name, started_at=now_iso(), beat_at=time.time(), state=state
        )

    def _loop(self) -> None:
        try:
            self.db.write(lambda c: heartbeats.prune_heartbeats(c, now=time.time()))
        except DATABASE_ERRORS as exc:
            log.warning("old worker heartbeats not pruned: %s", exc)
        while True:
            state = "stopped" if self._stop.is_set() else "alive"
            try:
                self.db.write(partial(self._beat, state=state))
            except DATABASE_ERRORS as exc:  # a busy database delays a beat, nothing more
                log.warning("worker heartbeat not recorded: %s", exc)
            if self._stop.is_set():
                return
            self._stop.wait(self.settings.worker_heartbeat_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def sweep_scratch(tmp_dir: Path, conn: Conn) -> int:
    """Remove analysis scratch folders whose task no live worker holds (killed mid-analysis).

    A folder is ``analysis-<task id>-<pid>``; it is kept while its task is running under an
    unexpired lease, so a worker in another container (another pid namespace) is never robbed.
    """
    live = tasks.live_task_ids(conn, time.time())
    removed = 0
    for folder in tmp_dir.glob("analysis-*-*"):
        task = folder.name.split("-")[1]
        if task.isdigit() and int(task) in live:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


def main(settings: Settings, *, once: bool = False, on_stored: StoredHook | None = None) -> None:
    """Run a worker until SIGTERM/SIGINT (or, with ``once``, until the queue is empty);
    ``on_stored``: called after each stored report (``StoredHook``)."""
    from service.limited_child import lower_priority
    from service.supervisor import PARENT_ENV, follow_parent, set_parent_death_signal

    parent = os.environ.get(PARENT_ENV)
    if parent:  # supervised: end with the API process, even when it is SIGKILLed
        set_parent_death_signal(signal.SIGTERM)
        # The signal starts the graceful stop (the last heartbeat, the "stopped" line); the
        # watchdog is the backstop that exits hard, so it leaves that stop a few seconds.
        follow_parent(int(parent), interval_s=5.0)
    lower_priority()  # analyses yield the CPU to the API when they share a machine
    runner = AnalysisWorker(settings, on_stored=on_stored)  # opens the database, migrated
    runner.blobs.check()  # an unreachable S3 store stops the start, with its reason
    swept = runner.db.read(lambda c: sweep_scratch(settings.tmp_dir, c))
    if swept:
        log.info("removed %d scratch folder(s) of killed analyses", swept)
    stale = runner.db.write(analysis.requeue_stale_reports)
    if stale:
        log.info("re-analysing %d run(s) with old reports", len(stale))
    signal.signal(signal.SIGTERM, lambda *_: runner.stop.set())
    signal.signal(signal.SIGINT, lambda *_: runner.stop.set())
    try:
        if once:
            while runner.run_once():
                pass
        else:
            runner.run_forever()
    finally:
        runner.close()


def cli(on_stored: StoredHook | None = None) -> None:
    """``python -m service.worker [--data-dir D] [--once]`` (and ``cptrace.worker``'s)."""
    parser = argparse.ArgumentParser(description="cptrace analysis worker")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    overrides = {"data_dir": args.data_dir} if args.data_dir else {}
    try:
        settings = Settings(**overrides)
    except SettingsError as exc:
        parser.exit(2, f"cptrace worker: {exc}\n")
    main(settings, once=args.once, on_stored=on_stored)


if __name__ == "__main__":
    cli()
