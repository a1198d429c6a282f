"""``--cpu-durations``: a test's CPU (its own and its children's) is told apart from its wall
time, per test and per file, also under pytest-xdist."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

pytest_plugins = ["pytester"]

BURN_AND_SLEEP = """
import subprocess, sys, time

def test_burns():
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass

def test_child_burns():
    code = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_sleeps():
    time.sleep(0.6)
"""


@pytest.mark.parametrize(
    "workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["serial", "xdist"]
)
def test_cpu_and_wall_are_reported_per_test_and_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the installed plugins: seconds
    # the runs are subprocesses (xdist's workers are anyway): testkit must be importable there
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    )
    pytester.makeconftest('pytest_plugins = ["testkit.cpu_time"]\n')
    pytester.makepyfile(test_mixed=BURN_AND_SLEEP)
    result = pytester.runpytest_subprocess("--cpu-durations=0", "-p", "no:cacheprovider", *workers)
    result.assert_outcomes(passed=3)
    rows = {}
    for line in result.outlines:
        got = re.match(r"\s*([\d.]+)s cpu\s+([\d.]+)s wall\s+(\S+)", line)
        if got:
            rows[got[3]] = (float(got[1]), float(got[2]))
    burns, child, sleeps = (
        rows[f"test_mixed.py::test_{n}"] for n in ("burns", "child_burns", "sleeps")
    )
    assert burns[0] >= 0.35 and child[0] >= 0.35, rows  # the child's CPU counts, once reaped
    assert sleeps[0] < 0.2 and sleeps[1] >= 0.55, rows  # sleeping is wall, not CPU
    file_cpu, file_wall = rows["test_mixed.py"]
    assert file_cpu == pytest.approx(burns[0] + child[0] + sleeps[0], abs=0.05)
    assert file_wall >= 0.55 + 0.35 + 0.35
    assert any(line.startswith("sum over 3 tests:") for line in result.outlines)
