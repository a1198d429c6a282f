"""The ``fork`` launcher of ``cptrace run``: one process imports the rank module, then forks it.

``torchrun`` starts every rank as a fresh interpreter, and itself imports torch to do so: a
two-rank CPU run pays the torch import three times (about 2.2 s of CPU each on a CPU build,
10-15 s of wall on a loaded two-core machine), for ranks that run a few milliseconds of gloo
work. Here the launcher imports the rank module (``runners.workload``, and torch with it) once
and forks the ranks from it, the way PyTorch's DataLoader forks its workers after torch is
imported: the import has started no computation, so no intra-op thread pool or CUDA context is
copied into a child.

Each rank gets the environment torchrun gives it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and torchrun's one intra-op thread when
``OMP_NUM_THREADS`` is unset (OpenMP read the variable when the parent loaded it, so the child
sets the thread count itself). A rank leaves through the interpreter's normal exit (its
``atexit`` hooks, its status file's last record), exceptions through ``sys.excepthook``. As
torchrun does, the first rank to fail stops the others; the exit status is that rank's.

Only for one host: ``auto`` picks it for ``device: cpu`` specs outside Slurm.

    python -m runners.forkrun --nproc 2 -m runners.workload --spec spec.json --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import socket
import sys
import time
from types import ModuleType

STOP_GRACE_S = 5.0
"""After the first failure, how long the other ranks get between SIGTERM and SIGKILL."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environment(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The variables torchrun sets for a rank of a one-host job (``env://`` rendezvous)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _rank(module: ModuleType, argv: list[str], env: dict[str, str]) -> int:
    """The body of a forked rank: its environment, then the module's ``main``."""
    os.environ.update(env)
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun's default for several ranks per host
        os.environ["OMP_NUM_THREADS"] = "1"
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
    code = module.main(argv)
    return int(code or 0)


def _stop(pids: set[int], grace_s: float) -> None:
    """SIGTERM the ranks still running, SIGKILL those left after ``grace_s``; reap them."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid:
                pids.discard(pid)
            else:
                time.sleep(0.05)
        if not pids:
            return


def _wait(pids: dict[int, int]) -> int:
    """Wait for every rank; the first failure stops the rest. Returns the job's exit status."""
    running = set(pids)
    while running:
        pid, status = os.wait()
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(
                f"cptrace fork launcher: rank {pids[pid]} (pid {pid}) exited with status {code};"
                f" stopping the other ranks",
                file=sys.stderr,
                flush=True,
            )
            _stop(running, STOP_GRACE_S)
            return code if code > 0 else 128 - code  # killed by signal N: 128 + N, as a shell
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage="%(prog)s --nproc N -m MODULE [ARGS ...]"
    )
    parser.add_argument("--nproc", type=int, required=True, help="ranks to fork")
    # Everything after ``-m MODULE`` is the module's, as with ``python -m``.
    split = argv.index("-m") if "-m" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if split + 1 >= len(argv):
        parser.error("no rank module: -m MODULE [ARGS ...] must follow the options")
    if args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    rank_args = argv[split + 2 :]
    module = importlib.import_module(argv[split + 1])  # once, here: the point of this launcher
    port = _free_port()
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered may be written twice, once by each child
    pids: dict[int, int] = {}
    for rank in range(args.nproc):
        pid = os.fork()
        if pid == 0:  # the child returns to the interpreter's exit below, not into the loop
            return _rank(module, rank_args, rank_environment(rank, args.nproc, port))
        pids[pid] = rank
    return _wait(pids)


if __name__ == "__main__":
    raise SystemExit(main())
