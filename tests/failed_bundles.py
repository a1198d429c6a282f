"""Bundles of jobs that failed or hung, for the pages, the CLI and the comments.

Everything in the failure records is real: the stacks are ``faulthandler`` dumps of two real
processes waiting in ``wait_for_peer`` (armed with ``faulthandler.register(SIGUSR1, ...)`` and
signalled, the way the profiler's bootstrap and watchdog do it), the exception record comes
from a real raised exception, and the traces are the checked-in CPU (gloo) capture.

``raised_with_traces``: rank 1 raised after the profiled steps, so the run has traces and is
analysed like any run: before the failure verdict it read like a run that ended well.
``hung_without_traces``: both ranks waited until the watchdog stopped the job; no trace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any

from testkit import DATA_DIR

CPU_SMOKE = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"
WAITER = '''\
import faulthandler, signal, sys, time

dump = open(sys.argv[2], "w")
faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)


def wait_for_peer(rank):
    print("ready", flush=True)
    time.sleep(60)


wait_for_peer(int(sys.argv[1]))
'''
LOG_TAIL = [f"[rank{r}] step {s} done" for s in range(3) for r in (0, 1)]


def faulthandler_stacks(tmp: Path, ranks: int = 2) -> dict[str, str]:
    """rank -> the faulthandler dump of a real process waiting in ``wait_for_peer``."""
    script = tmp / "train_wait.py"
    script.write_text(WAITER)
    # compiled as "train.py", so the frames name the user's script, not this machine's paths
    run = f"import sys; exec(compile(open({str(script)!r}).read(), 'train.py', 'exec'))"
    stacks = {}
    for rank in range(ranks):
        dump = tmp / f"stack{rank}.txt"
        proc = subprocess.Popen(
            [sys.executable, "-c", run, str(rank), str(dump)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while "wait_for_peer" not in dump.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            proc.kill()
            proc.wait()
        stacks[str(rank)] = dump.read_text()
    assert all("wait_for_peer" in s for s in stacks.values()), stacks
    return stacks


def _pack_step(tokens: int) -> None:
    raise ValueError(f"packed token count {tokens} is not a multiple of 8 (FP8 GEMM dimension)")


def raised_exception() -> dict[str, Any]:
    """The runner's exception record (type, message, where, traceback) of a real exception."""
    try:
        _pack_step(8190)
    except ValueError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return {
            "type": type(exc).__name__,
            "message": str(exc),
            "where": {"file": frame.filename, "line": frame.lineno, "function": frame.name},
            "traceback": "".join(traceback.format_exception(exc)).rstrip().splitlines(),
        }
    raise AssertionError("unreachable")


def _smoke_dir(out: Path) -> Path:
    out.mkdir(parents=True)
    with tarfile.open(CPU_SMOKE) as tar:
        tar.extractall(out, filter="data")
    return out


def _write(
    bundle: Path, failure: dict[str, Any], *, keep_traces: bool, run: dict[str, Any] | None
) -> Path:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["failure"] = failure
    manifest["run"] = {**manifest["run"], "name": bundle.name, **(run or {})}
    if not keep_traces:
        for trace in manifest["traces"]:
            (bundle / trace["path"]).unlink()
        manifest["traces"] = []
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
    archive = bundle.with_suffix(".tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(bundle.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(bundle)), recursive=False)
    return bundle


def raised_with_traces(
    tmp: Path, stacks: dict[str, str], run: dict[str, Any] | None = None
) -> Path:
    """A bundle directory (and ``.tar.gz`` beside it) of a run whose rank 1 raised; ``run``:
    manifest ``run`` fields to set (the loop's tags)."""
    exception = raised_exception()
    failure = {
        "summary": f"rank 1 raised ValueError: {exception['message']}",
        "exit_status": 1,
        "failed_rank": 1,
        "failed_ranks": [1],
        "exception": exception,
        "ranks": {"0": {"state": "waiting", "collective": "all_reduce"}, "1": {"state": "failed"}},
        "stopped_by_watchdog": True,
        "watchdog_s": 3.0,
        "stacks": {"0": stacks["0"]},
        "log_tail": [*LOG_TAIL, *exception["traceback"]],
    }
    return _write(_smoke_dir(tmp / "raised-after-steps"), failure, keep_traces=True, run=run)


def hung_without_traces(
    tmp: Path, stacks: dict[str, str], run: dict[str, Any] | None = None
) -> Path:
    """A bundle directory (and ``.tar.gz``) of a 2-rank job the watchdog stopped as hung."""
    failure = {
        "summary": "no rank made progress for 3 s: the watchdog stopped the job",
        "exit_status": -15,
        "ranks": {"0": {"state": "waiting"}, "1": {"state": "waiting"}},
        "stopped_by_watchdog": True,
        "watchdog_s": 3.0,
        "timed_out": False,
        "stacks": stacks,
        "log_tail": LOG_TAIL,
    }
    return _write(_smoke_dir(tmp / "hung-two-ranks"), failure, keep_traces=False, run=run)


__all__ = ["faulthandler_stacks", "hung_without_traces", "raised_exception", "raised_with_traces"]
