"""``benchmarks/hta_compare.py`` needs HTA's python (``--hta-python`` or
``$CPTRACE_HTA_PYTHON``; HTA is not a project dependency): without one that imports HTA it stops
at once with one line saying what to do, never a traceback and never after minutes of runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/hta_compare.py"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CPTRACE_HTA_PYTHON"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def test_without_an_hta_python_it_says_how_to_get_one() -> None:
    done = _run()
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "--hta-python" in done.stderr and "CPTRACE_HTA_PYTHON" in done.stderr
    assert "pip install HolisticTraceAnalysis" in done.stderr


def test_a_python_without_hta_or_no_python_at_all_is_named() -> None:
    # this interpreter is the project's: HTA is not installed in it
    without = _run("--hta-python", sys.executable)
    assert without.returncode == 1
    assert "Traceback" not in without.stderr
    assert "cannot import HolisticTraceAnalysis" in without.stderr
    missing = _run("--hta-python", str(ROOT / "no-such-python"))
    assert missing.returncode == 1
    assert "Traceback" not in missing.stderr
    assert "cannot run the HTA python" in missing.stderr
