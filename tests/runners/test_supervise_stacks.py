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

JOB = "import time\n\ndef wait_here():\n    time.sleep(60)\n\nwait_here()\n"


@pytest.mark.parametrize("reachable", [True, False], ids=["signal", "request-file"])
def test_a_waiting_rank_answers_with_its_stack(tmp_path: Path, reachable: bool) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = child_environment(ProfileOptions(), tmp_path / "scratch")
    status_dir = tmp_path / "scratch" / "status"
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + 20
        while not (statuses := read_statuses(status_dir)):
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
