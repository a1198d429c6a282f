"""Launcher side of failure diagnosis: run a job, watch its ranks, stop it when it fails or hangs.

``supervise`` starts the command in its own process group, copies its output into a log (and,
when asked, to the terminal as it comes), and polls the ranks' status files
(``runners/profile/rankstatus.py``). Once a rank reports an exception, the others get
``watchdog_s`` seconds to finish on their own (NCCL's async error handling or a gloo peer error
usually ends them). A rank that has waited in one collective for more than ``hang_s`` makes the
job *hung*. Before a failed, hung or timed-out job is stopped (SIGTERM, then SIGKILL to the
whole group), every live rank is sent ``SIGUSR1`` and its ``faulthandler`` writes the Python
stack of each thread; the stacks go into the failure record, so it says where each rank was
waiting, not only that it was. The result says which rank failed first, where and why, and what
every other rank was doing.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from runners.profile.command import redact_argv
from runners.profile.rankstatus import STACKS_SIGNAL, stacks_path, stacks_request_path

LOG_TAIL_LINES = 60
FAILURE_TAIL_LINES = 40
POLL_S = 0.2
STACK_WAIT_S = 3.0
"""How long the watchdog waits for the signalled ranks to write their stacks."""
MAX_STACK_CHARS = 32_000
"""Per rank: faulthandler lists the innermost frames first, so the head is what matters."""

Echo = Callable[[str], None]


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
    hung: dict[str, Any] | None = None
    """The rank found waiting longer than ``hang_s`` (``rank``, ``collective``, ``waiting_s``)."""
    hang_s: float | None = None
    timed_out: bool = False
    cancelled: bool = False
    start_error: str | None = None
    """Why the command could not be started (e.g. the executable does not exist)."""
    stacks: dict[int, str] = field(default_factory=dict)
    """rank -> every thread's Python stack, dumped just before the job was stopped."""

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0
            and self.first_failure is None
            and not (self.timed_out or self.cancelled or self.start_error or self.hung)
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


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # after "(comm)": state, ppid


def descends_from(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or one of its descendants (torchrun starts each
    worker in a session of its own, so the process group does not tell)."""
    seen = 0
    current: int | None = pid
    while current is not None and current > 1 and seen < 64:
        if current == root:
            return True
        current, seen = _parent(current), seen + 1
    return False


def dump_stacks(
    statuses: dict[int, dict[str, Any]], status_dir: Path, root: int,
    wait_s: float = STACK_WAIT_S,
) -> dict[int, str]:
    """Ask every live rank under process ``root`` for its stacks; rank -> text.

    A rank whose status names a pid that descends from ``root`` gets the signal (never a
    recycled pid of someone else's process); any other rank (in a sandbox's pid namespace) a
    request file its status thread answers. A rank that does not answer within ``wait_s`` is
    left out.
    """
    asked: dict[int, Path] = {}
    for rank, status in sorted(statuses.items()):
        pid = status.get("pid")
        if not isinstance(pid, int) or status.get("state") == "exited":
            continue
        asked[rank] = stacks_path(status_dir, rank)
        try:
            # A rank that raised may be in interpreter shutdown, where faulthandler has given
            # the signal back to its default action (terminate): ask it by file instead.
            if status.get("state") == "failed" or not descends_from(pid, root):
                raise ProcessLookupError(pid)
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            stacks_request_path(status_dir, rank).touch()
    stacks: dict[int, str] = {}
    deadline = time.monotonic() + wait_s
    sizes: dict[int, int] = {}
    while asked and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank, path in list(asked.items()):
            size = path.stat().st_size if path.exists() else 0
            if size and sizes.get(rank) == size:  # written, and no longer growing
                stacks[rank] = path.read_text(encoding="utf-8", errors="replace")[:MAX_STACK_CHARS]
                del asked[rank]
            sizes[rank] = size
    return stacks


class _Output:
    """The job's output: copied into the log and, when ``echo`` is given, to the terminal."""

    def __init__(self, log: IO[bytes], echo: Echo | None) -> None:
        self.log = log
        self.echo = echo
        self._lock = threading.Lock()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes) -> None:
        with self._lock:
            self.log.write(data)
            self.log.flush()
            if self.echo is not None:
                text = self._decoder.decode(data)
                if text:
                    self.echo(text)

    def note(self, text: str) -> None:
        """A line of cptrace's own (the watchdog's decision) in the same stream."""
        self.write(text.encode())

    def pump(self, pipe: IO[bytes]) -> None:
        """Copy ``pipe`` until its writers are gone (run in a thread)."""
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(pipe.fileno(), 65536):
                self.write(chunk)


def _start(
    cmd: list[str], env: dict[str, str], cwd: Path | None, output: _Output
) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=env, start_new_session=True, cwd=cwd,
    )
    assert proc.stdout is not None
    pump = threading.Thread(
        target=output.pump, args=(proc.stdout,), name="cptrace-job-output", daemon=True
    )
    pump.start()
    return proc, pump


def supervise(
    cmd: list[str],
    *,
    log: Path,
    env: dict[str, str],
    status_dir: Path | None = None,
    watchdog_s: float | None = None,
    hang_s: float | None = None,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
    stop_grace_s: float = 5.0,
    cwd: Path | None = None,
    echo: Echo | None = None,
) -> Supervised:
    """Run ``cmd`` to its end, or stop it (timeout, cancel, ``watchdog_s`` after a failure,
    a rank waiting in one collective for more than ``hang_s``); ``echo`` gets its output live."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("ab") as fh:
        output = _Output(fh, echo)
        output.note(f"$ {shlex.join(redact_argv(cmd))}\n")
        try:
            proc, pump = _start(cmd, env, cwd, output)
        except OSError as exc:
            return Supervised(cmd, None, 0.0, log, start_error=f"cannot start {cmd[0]}: {exc}")
        result = Supervised(cmd, None, 0.0, log, hang_s=hang_s)
        deadline = None if timeout_s is None else started + timeout_s
        next_status = 0.0
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(POLL_S)
                break
            now = time.monotonic()
            if status_dir is not None and now >= next_status:
                next_status = now + 2 * POLL_S
                statuses = read_statuses(status_dir)
                _note_failure(result, statuses, now - started)
                _note_hang(result, statuses, hang_s)
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
            if result.cancelled or result.timed_out or result.stopped_by_watchdog or result.hung:
                output.note(_stop_reason(result, watchdog_s))
                if status_dir is not None and not result.cancelled:
                    result.stacks = dump_stacks(read_statuses(status_dir), status_dir, proc.pid)
                stop_group(proc, stop_grace_s)
                break
        pump.join(timeout=stop_grace_s)  # a straggler holding the pipe must not hold us
    result.returncode = proc.returncode
    result.wall_s = round(time.monotonic() - started, 3)
    result.statuses = read_statuses(status_dir)
    _note_failure(result, result.statuses, result.wall_s)
    return result


def _stop_reason(result: Supervised, watchdog_s: float | None) -> str:
    if result.stopped_by_watchdog and result.first_failure is not None:
        return (
            f"cptrace: rank {result.first_failure['rank']} failed "
            f"{result.first_failure_after_s:.1f} s in; stopping the job {watchdog_s} s later "
            "(watchdog), after dumping every rank's stack\n"
        )
    if result.hung is not None:
        return (
            f"cptrace: rank {result.hung['rank']} has waited in {result.hung['collective']} for "
            f"{result.hung['waiting_s']} s (over --hang-timeout {result.hang_s} s): the job is "
            "hung; dumping every rank's stack, then stopping it\n"
        )
    if result.timed_out:
        return "cptrace: the job ran over its timeout; dumping every rank's stack, stopping it\n"
    return "cptrace: cancelled; stopping the job\n"


def _note_hang(
    result: Supervised, statuses: dict[int, dict[str, Any]], hang_s: float | None
) -> None:
    if hang_s is None or result.hung is not None:
        return
    now = time.time()
    # waited so far = at the last write + since it (a rank whose status thread cannot run, the
    # GIL held inside the collective, stops writing but keeps waiting)
    waited = {
        rank: float(s.get("waiting_s") or 0.0) + max(0.0, now - float(s.get("updated_at") or now))
        for rank, s in statuses.items() if s.get("state") == "waiting"
    }
    over = {rank: w for rank, w in waited.items() if w > hang_s}
    if over:
        rank = max(over, key=lambda r: over[r])
        result.hung = {
            "rank": rank, "collective": statuses[rank].get("collective"),
            "waiting_s": round(over[rank], 3),
        }


def _note_failure(result: Supervised, statuses: dict[int, dict[str, Any]], at_s: float) -> None:
    if result.first_failure is not None:
        return
    failed = [s for s in statuses.values() if s.get("state") == "failed"]
    if failed:
        # Several ranks may have failed between two polls: the earliest write is the cause.
        result.first_failure = min(failed, key=lambda s: s.get("updated_at", 0.0))
        result.first_failure_after_s = round(at_s, 3)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python3[.\d]*[/\\]")
_ROOT = Path(__file__).resolve().parents[2]
_OURS = (str(_ROOT / "runners" / "profile"), str(_ROOT / "cptrace" / "probe"))


def waiting_frame(stack: str) -> dict[str, Any] | None:
    """The innermost frame of the job's own code in the main thread's stack (``faulthandler``
    text, innermost first): the line the rank was waiting on. Library and cptrace frames
    (torch's collective, our status wrapper) are skipped; None when no frame is the job's."""
    threads = [t for t in re.split(r"\n(?=\S)", stack.strip()) if t]
    main = next((t for t in threads if "in <module>" in t), threads[0] if threads else "")
    for line in main.splitlines()[1:]:
        m = _FRAME.match(line)
        if m and not _LIBRARY.search(m["file"]) and not m["file"].startswith(_OURS):
            return {"file": m["file"], "line": int(m["line"]), "function": m["function"]}
    return None


def failure_record(result: Supervised, *, watchdog_s: float | None) -> dict[str, Any] | None:
    """The manifest's ``failure`` object for a run that did not end cleanly (None if it did).

    Shaped as ``analyzers.manifest.FailureRecord`` (plus ``hung``/``hang_timeout_s`` and each
    rank's ``waiting_at``, the job's own line its stack was waiting on).
    """
    if result.ok:
        return None
    ranks: dict[str, dict[str, Any]] = {}
    for rank in sorted(set(result.statuses) | set(result.stacks)):
        status = result.statuses.get(rank, {})
        ranks[str(rank)] = {
            k: v for k, v in status.items() if k in ("state", "collective", "waiting_s")
        }
        at = waiting_frame(result.stacks[rank]) if rank in result.stacks else None
        if at is not None:
            ranks[str(rank)]["waiting_at"] = at
    first = result.first_failure
    record: dict[str, Any] = {
        "exit_status": result.returncode,
        "failed_rank": None if first is None else first["rank"],
        "failed_ranks": sorted(r for r, s in result.statuses.items() if s.get("state") == "failed"),
        "exception": None if first is None else first.get("exception"),
        "ranks": ranks,
        "stopped_by_watchdog": result.stopped_by_watchdog,
        "watchdog_s": watchdog_s,
        "hung": result.hung,
        "hang_timeout_s": result.hang_s,
        "timed_out": result.timed_out,
        "cancelled": result.cancelled,
        "start_error": result.start_error,
        "wall_s": result.wall_s,
        "stacks": {str(r): text for r, text in sorted(result.stacks.items())},
        "log_tail": result.tail(FAILURE_TAIL_LINES).splitlines(),
    }
    record["summary"] = failure_summary(record)
    return record


def _at(status: dict[str, Any]) -> str:
    where = status.get("waiting_at")
    if not isinstance(where, dict):
        return ""
    return f" at {where.get('file')}:{where.get('line')} in {where.get('function')}"


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
                f"({status.get('waiting_s')} s){_at(status)}"
            )
        elif status.get("state") == "failed":
            parts.append(f"rank {rank} failed too")
        elif status.get("waiting_at"):
            parts.append(f"rank {rank} was {status.get('state') or 'running'}{_at(status)}")
    hung = record.get("hung")
    if record.get("stopped_by_watchdog"):
        parts.append(
            f"the launcher stopped the job {record.get('watchdog_s')} s after the first failure"
        )
    elif hung:
        parts.append(
            f"hung: rank {hung.get('rank')} waited in {hung.get('collective')} longer than "
            f"{record.get('hang_timeout_s')} s, so the launcher stopped the job"
        )
    elif record.get("timed_out"):
        parts.append("the job ran over its timeout and was stopped")
    elif record.get("cancelled"):
        parts.append("the job was cancelled")
    if record.get("exit_status") not in (None, 0):
        parts.append(f"exit status {record['exit_status']}")
    return "; ".join(parts) or "the job did not end cleanly"
