"""Helpers every test room shares: the test-data path, free loopback ports, the shared traces.

Tests import it as ``testkit`` (``tests/`` is on ``sys.path`` through the root conftest, as for
every helper module beside the tests). One home for each: no room defines its own.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "tests" / "data"
"""Real traces and bundles committed with the tests (``tests/data/<scenario>/``)."""

SHARED_TRACES_ENV = "CPTRACE_SHARED_TRACES"
"""Names a folder of extra real traces outside the repository (``--shared-traces`` sets it)."""

_handed_out: set[int] = set()


def shared_traces_dir() -> Path | None:
    """The folder of extra real traces, or None when the variable is unset (tests then skip)."""
    value = os.environ.get(SHARED_TRACES_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise RuntimeError(f"{SHARED_TRACES_ENV}={value!r} is not a directory")
    return path


def _worker_slot() -> tuple[int, int]:
    """(this xdist worker's index, number of workers); (0, 1) without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return index, max(count, 1)


_PORTS = range(20000, 32000)
"""Below Linux's ephemeral range (32768-60999): ports the kernel hands to other sockets
(outgoing connections, ``bind(0)``) never land here."""


def free_port() -> int:
    """A free loopback TCP port that no other test process of this run is handed.

    Under pytest-xdist each worker draws from its own slice of ``_PORTS``, so two workers never
    race for one port; a worker never hands the same port out twice; the port is bound once to
    prove it free.
    """
    index, count = _worker_slot()
    size = len(_PORTS) // count
    first = _PORTS.start + index * size
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(first, first + size)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {first}-{first + size - 1} for this worker")


def slow_files_first(items: list[pytest.Item]) -> None:
    """Reorder ``items``: files holding a ``slow`` test first, each file whole and in order.

    Under ``make test`` (xdist ``--dist loadfile --no-loadscope-reorder``) a worker is handed the
    next file as it runs out, in this order: the long files start first and the short ones fill
    in at the end, so no long file starts last and keeps one worker busy while the other idles
    (xdist's own order, most tests first, put the one-test end-to-end files last).
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: file order kept
