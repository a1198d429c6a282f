"""The fork launcher (``runners/forkrun.py``) with a real rank module in real processes: the
module is imported once and every rank is forked from that process with torchrun's variables;
a rank's exit hooks run; the first failure stops the others and gives the exit status."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RANK_MODULE = '''
import atexit, os, sys, time
from pathlib import Path

OUT = Path(os.environ["FORKRUN_TEST_OUT"])
with (OUT / "imports").open("a") as fh:  # once per import of this module
    fh.write(f"{os.getpid()}\\n")


def main(argv):
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "OMP_NUM_THREADS")
    seen = " ".join(os.environ.get(k, "-") for k in keys)
    (OUT / f"rank{rank}").write_text(f"{os.getpid()} {os.getppid()} {seen} {' '.join(argv)}")
    atexit.register(lambda: (OUT / f"exit{rank}").write_text("at exit"))
    if argv and argv[0] == "--fail" and rank == 1:
        raise RuntimeError("rank 1 broke")
    if argv and argv[0] == "--fail":
        time.sleep(120)  # the failing rank's peer, blocked: the launcher must stop it
    return 0
'''


def _forkrun(tmp_path: Path, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rank_module_for_test.py").write_text(RANK_MODULE)
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "MASTER_PORT")
    }  # fmt: skip
    env |= {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
            "FORKRUN_TEST_OUT": str(tmp_path)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "runners.forkrun", f"--nproc={nproc}", "-m",
         "rank_module_for_test", *args],
        env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def test_ranks_are_forked_from_one_import_with_torchruns_variables(tmp_path: Path) -> None:
    done = _forkrun(tmp_path, 3, "--spec", "s.json", "--out", "x")
    assert done.returncode == 0, done.stderr
    imports = (tmp_path / "imports").read_text().split()
    assert len(imports) == 1, imports  # the module was imported once, in the launcher
    ports = set()
    for rank in range(3):
        pid, ppid, *seen = (tmp_path / f"rank{rank}").read_text().split()
        assert ppid == imports[0] and pid != imports[0]  # forked from the importing process
        assert seen[:5] == [str(rank), str(rank), "3", "3", "127.0.0.1"], seen
        assert seen[6] == "1", seen  # torchrun's one intra-op thread when the variable is unset
        assert seen[7:] == ["--spec", "s.json", "--out", "x"]  # the module's own arguments
        ports.add(seen[5])
        assert (tmp_path / f"exit{rank}").read_text() == "at exit"  # a normal interpreter exit
    assert len(ports) == 1 and ports.pop().isdigit()


def test_the_first_failure_stops_the_other_ranks_and_gives_the_status(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _forkrun(tmp_path, 3, "--fail")
    took = time.monotonic() - started
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "RuntimeError: rank 1 broke" in done.stderr  # the rank's own traceback (excepthook)
    assert "rank 1 (pid" in done.stderr and "stopping the other ranks" in done.stderr
    assert (tmp_path / "exit1").exists()  # the failed rank still ran its exit hooks
    assert took < 60, f"the blocked ranks were not stopped ({took:.0f} s)"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--nproc=2"], "no rank module"), (["--nproc=0", "-m", "x"], "at least 1")],
)
def test_bad_command_lines_are_refused(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runners.forkrun", *args], cwd=REPO,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr
