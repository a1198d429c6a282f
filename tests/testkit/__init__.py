"""Helpers every test room shares: the test-data path, free loopback ports, the shared traces,
the reference workload, the demo bundles.

Tests import it as ``testkit`` (``tests/`` is on ``sys.path`` through the root conftest, as for
every helper module beside the tests). One home for each: no room defines its own.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "tests" / "data"
"""Real traces and bundles committed with the tests (``tests/data/<scenario>/``)."""

REFERENCE_WORKLOAD: dict[str, object] = {
    "implementation": "te",
    "cp_size": 2,
    "cp_comm": "p2p",
    "strategy": "dual_chunk_swap",
    "causal": True,
    "heads": 16,
    "head_dim": 128,
    "dtype": "bf16",
    "layers": 4,
    "seqlens": [8192, 4096, 2048, 2048],
}
"""The reference workload (DESIGN: 2 ranks, P2P CP, THD, causal, bf16, 16 x 128, 4 layers) as a
manifest's ``workload`` block: what the real traces in ``tests/data/te-2.20.2-h200x2`` ran."""

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


_demo_dir: Path | None = None


def demo_bundles_dir() -> Path:
    """Every demo bundle in one folder, as ``cptrace serve --seed-demo`` seeds them: the captured
    ones of ``demo/bundles`` (linked) and the ones ``runners.demo_bundles`` builds from
    ``demo/traces`` (the repository keeps those traces once). Built once per test process."""
    global _demo_dir
    if _demo_dir is None:
        from runners.demo_bundles import build_trace_bundles

        folder = Path(tempfile.mkdtemp(prefix="cptrace-demo-bundles-"))
        atexit.register(shutil.rmtree, folder, True)
        for captured in sorted((REPO_ROOT / "demo" / "bundles").glob("*.tar.gz")):
            (folder / captured.name).symlink_to(captured)
        build_trace_bundles(folder)
        _demo_dir = folder
    return _demo_dir


def demo_bundle(name: str) -> Path:
    """One demo bundle by name (``te-2.20.2-nsys-3arms``), captured or built."""
    path = demo_bundles_dir() / f"{name}.tar.gz"
    if not path.is_file():
        raise FileNotFoundError(f"no demo bundle {name!r} in {demo_bundles_dir()}")
    return path


def script_module(path: Path, name: str | None = None) -> ModuleType:
    """Import a file that is not in a package (a benchmark, a script, a user's job) as a module."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
