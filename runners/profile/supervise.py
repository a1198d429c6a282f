"""Launcher side of failure diagnosis: run a job, watch its ranks, stop it after the first failure.

``supervise`` starts the command in its own process group with its output in a log, and polls
the ranks' status files (``runners/profile/rankstatus.py``). Once a rank reports an exception,
the others get ``watchdog_s`` seconds to finish on their own (NCCL's async error handling or
a gloo peer error usually ends them); after that the whole group is stopped (SIGTERM, then
SIGKILL), so a rank that raised before a collective never leaves the job hanging. The result
says which rank failed first, where and why, and what every other rank was doing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 60
POLL_S = 0.2


@dataclass(slots=True)
class Supervised:
    """How a supervised command ended."""

    command: list[str]
    returncode: int | None
    wall_s: float
    log: Path
    statuses: dict[int, dict[str, Any]] = field(default_factory=dict)
    first_failure: dict[str, Any] | None = None
    """Status record of the first rank that reported an exception (None: none did)."""
    first_failure_after_s: float | None = None
    stopped_by_watchdog: bool = False
    timed_out: bool = False
    cancelled: bool = False
    start_error: str | None = None
    """Why the command could not be started (e.g. the executable does not exist)."""

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0
            and self.first_failure is None
            and not (self.timed_out or self.cancelled or self.start_error)
        )

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log, lines)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return ""


def read_statuses(status_dir: Path | None) -> dict[int, dict[str, Any]]:
    """Every rank's last status record (unreadable or half-written files are skipped)."""
    return read_rank_records(status_dir, "rank*.json")


def read_rank_records(directory: Path | None, pattern: str) -> dict[int, dict[str, Any]]:
    """rank -> the JSON record of each file matching ``pattern`` that names its rank. Files that
    cannot be read are skipped: a rank killed mid-write leaves a half-written one (status records
    here, the probe's records in ``facts``)."""
    out: dict[int, dict[str, Any]] = {}
    if directory is None or not directory.is_dir():
        return out
    for path in sorted(directory.glob(pattern)):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            out[record["rank"]] = record
    return out


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the command's process group, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def supervise(
    cmd: list[str],
    *,
    log: Path,
    env: dict[str, str],
    status_dir: Path | None = None,
    watchdog_s: float | None = None,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
    stop_grace_s: float = 5.0,
    cwd: Path | None = None,
) -> Supervised:
    """Run ``cmd`` to its end, or stop it (timeout, cancel, ``watchdog_s`` after a failure)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        try:
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd
            )
        except OSError as exc:
            return Supervised(cmd, None, 0.0, log, start_error=f"cannot start {cmd[0]}: {exc}")
        result = Supervised(cmd, None, 0.0, log)
        deadline = None if timeout_s is None else started + timeout_s
        next_status = 0.0
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(POLL_S)
                break
            now = time.monotonic()
            if status_dir is not None and now >= next_status:
                next_status = now + 2 * POLL_S
                _note_failure(result, read_statuses(status_dir), now - started)
            if cancel is not None and cancel.is_set():
                result.cancelled = True
            elif deadline is not None and now > deadline:
                result.timed_out = True
            elif (
                result.first_failure_after_s is not None
                and watchdog_s is not None
                and now - started - result.first_failure_after_s > watchdog_s
            ):
                result.stopped_by_watchdog = True
            if result.cancelled or result.timed_out or result.stopped_by_watchdog:
                if result.stopped_by_watchdog:
                    fh.write(
                        f"cptrace: rank {result.first_failure['rank']} failed "  # type: ignore[index]
                        f"{result.first_failure_after_s:.1f} s in; stopping the job "
                        f"{watchdog_s} s later (watchdog)\n"
                    )
                    fh.flush()
                stop_group(proc, stop_grace_s)
                break
    result.returncode = proc.returncode
    result.wall_s = round(time.monotonic() - started, 3)
    result.statuses = read_statuses(status_dir)
    _note_failure(result, result.statuses, result.wall_s)
    return result


def _note_failure(result: Supervised, statuses: dict[int, dict[str, Any]], at_s: float) -> None:
    if result.first_failure is not None:
        return
    failed = [s for s in statuses.values() if s.get("state") == "failed"]
    if failed:
        # Several ranks may have failed between two polls: the earliest write is the cause.
        result.first_failure = min(failed, key=lambda s: s.get("updated_at", 0.0))
        result.first_failure_after_s = round(at_s, 3)


def failure_record(result: Supervised, *, watchdog_s: float | None) -> dict[str, Any] | None:
    """The manifest's ``failure`` object for a run that did not end cleanly (None if it did)."""
    if result.ok:
        return None
    ranks = {
        str(rank): {k: v for k, v in status.items() if k in ("state", "collective", "waiting_s")}
        for rank, status in sorted(result.statuses.items())
    }
    first = result.first_failure
    record: dict[str, Any] = {
        "exit_status": result.returncode,
        "failed_rank": None if first is None else first["rank"],
        "failed_ranks": sorted(r for r, s in result.statuses.items() if s.get("state") == "failed"),
        "exception": None if first is None else first.get("exception"),
        "ranks": ranks,
        "stopped_by_watchdog": result.stopped_by_watchdog,
        "watchdog_s": watchdog_s,
        "timed_out": result.timed_out,
        "cancelled": result.cancelled,
        "start_error": result.start_error,
        "wall_s": result.wall_s,
        "log_tail": result.tail(20).splitlines(),
    }
    record["summary"] = failure_summary(record)
    return record


def failure_summary(record: dict[str, Any]) -> str:
    """One paragraph: who failed, where, why, what the others were doing, how it ended."""
    parts = []
    exc = record.get("exception")
    if record.get("start_error"):
        parts.append(record["start_error"])
    if exc:
        where = exc.get("where") or {}
        at = ""
        if where:
            at = f" at {where.get('file')}:{where.get('line')} in {where.get('function')}"
        parts.append(f"rank {record['failed_rank']} raised {exc['type']}{at}: {exc['message']}")
    for rank, status in (record.get("ranks") or {}).items():
        if str(rank) == str(record.get("failed_rank")):
            continue
        if status.get("state") == "waiting":
            parts.append(
                f"rank {rank} was waiting in {status.get('collective')} "
                f"({status.get('waiting_s')} s)"
            )
        elif status.get("state") == "failed":
            parts.append(f"rank {rank} failed too")
    if record.get("stopped_by_watchdog"):
        parts.append(
            f"the launcher stopped the job {record.get('watchdog_s')} s after the first failure"
        )
    elif record.get("timed_out"):
        parts.append("the job ran over its timeout and was stopped")
    elif record.get("cancelled"):
        parts.append("the job was cancelled")
    if record.get("exit_status") not in (None, 0):
        parts.append(f"exit status {record['exit_status']}")
    return "; ".join(parts) or "the job did not end cleanly"
