"""The repository holds the product: no development diary, no path of the machine a file was
written on. Traces outside the repository come only through ``--shared-traces`` /
``$CPTRACE_SHARED_TRACES`` (``tests/testkit``); ``.ci/run`` is the one place that looks beside
the clone."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Absolute paths of a particular machine, and the shared folder beside a checkout.
MACHINE_PATH = re.compile(r"(?<![\w.-])(?:/work/|/root/|/home/[a-z][\w-]*/)|\.\./shared\b")
#: Temp folders of a run, in the texts that describe the product (code may use a temp folder).
TEMP_PATH = re.compile(r"(?<![\w.$}-])/tmp/")
PROSE = re.compile(r"(\.md|\.txt|\.rst)$|^benchmarks/results/")
#: .ci/run: CI's copy of shared/ lies beside the clone; this file: its patterns and examples.
ALLOWED = {".ci/run", "tests/test_repository_is_the_product.py"}


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def machine_paths(rel: str, text: str) -> list[str]:
    """``rel:line: text`` of each line naming a machine-local path."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        if MACHINE_PATH.search(line) or (PROSE.search(rel) and TEMP_PATH.search(line)):
            hits.append(f"{rel}:{n}: {line.strip()[:120]}")
    return hits


def test_no_development_diary() -> None:
    assert not (ROOT / "docs" / "sessions").exists()
    dated = [p for p in tracked_files() if re.search(r"(^|/)(day\d+|\d{4}-\d\d-\d\d)([/_.-]|$)", p)]
    assert dated == []


def test_no_machine_local_path_in_any_tracked_file() -> None:
    hits = []
    for rel in tracked_files():
        if rel in ALLOWED:
            continue
        data = (ROOT / rel).read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (gzipped traces, images, archives)
        hits += machine_paths(rel, data.decode("utf-8", errors="replace"))
    assert hits == []


def test_the_check_sees_machine_paths() -> None:
    # The samples are put together from pieces, so this file holds no machine path itself.
    work, shared, tmp = "/" + "work/", ".." + "/shared", "/" + "tmp/"
    assert machine_paths("docs/x.md", f"run `cd {work}wt/readers` first")
    assert machine_paths("tests/x.py", 'SEARCHED = [ROOT.parent / "shared"]') == []
    assert machine_paths("tests/x.py", f'Path("{shared}/traces")')
    assert machine_paths("benchmarks/RESULTS.md", f"--out {tmp}cptrace_large.sqlite")
    assert machine_paths("tests/x.py", f'assert "{tmp}" not in error') == []
    assert machine_paths("docs/service.md", "uploads in `var/tmp/`") == []
    assert machine_paths("docs/x.md", 'into "$TMPDIR/cptrace.sqlite"') == []
