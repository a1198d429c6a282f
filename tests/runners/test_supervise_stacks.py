"""The watchdog's stack dump on a real process with the profiling bootstrap: by signal, and by
request file for a rank it cannot signal (a sandbox's own pid namespace)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from runners.profile.run import ProfileOptions, child_environment
from runners.profile.supervise import dump_stacks, read_statuses, waiting_frame

JOB = (
    "import pathlib, sys, time\n\ndef wait_here():\n    time.sleep(60)\n\n"
    "pathlib.Path(sys.argv[1]).touch()\nwait_here()\n"
)
"""Touches its argument, then sleeps at line 4 (the line the stack must name)."""


def _sleeping(pid: int) -> bool:
    """The process is in an interruptible sleep (state S: here, the job's ``time.sleep``)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
    except OSError:
        return False


@pytest.mark.parametrize("reachable", [True, False], ids=["signal", "request-file"])
def test_a_waiting_rank_answers_with_its_stack(tmp_path: Path, reachable: bool) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = child_environment(ProfileOptions(), tmp_path / "scratch")
    status_dir = tmp_path / "scratch" / "status"
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(script), str(ready)], env=env)
    try:
        deadline = time.monotonic() + 60
        # asked only once the job waits at its line: on a loaded machine the bootstrap's status
        # file is there while the job is still importing (its stack then names an import)
        while not (
            (statuses := read_statuses(status_dir)) and ready.exists() and _sleeping(proc.pid)
        ):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        # root=1: no rank descends from it, so the launcher must ask by file
        stacks = dump_stacks(statuses, status_dir, proc.pid if reachable else 1)
        assert proc.poll() is None, "asking for stacks must not stop the rank"
    finally:
        proc.kill()
        proc.wait()
    assert f'File "{script}", line 4 in wait_here' in stacks[0]
    assert waiting_frame(stacks[0]) == {"file": str(script), "line": 4, "function": "wait_here"}
    assert not (status_dir / "stacks_rank0.request").exists()
