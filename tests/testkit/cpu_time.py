"""``--cpu-durations=N``: the N tests that used the most CPU, and the CPU and wall time per file.

Wall time on a shared machine is mostly the machine (a test that takes 8 s of CPU takes 40 s
at a load of 10 on two cores); CPU seconds are the suite's own cost. Each phase (setup, call,
teardown) is measured with ``getrusage`` of the test process and of its children: a child
counts once it is reaped, so a module's server, killed at the last test's teardown, lands
there; a grandchild its parent never waits for is not counted. Under pytest-xdist the numbers
travel to the controller in each report's ``user_properties``.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest

CPU_PROPERTY = "cpu_s"
_START = pytest.StashKey[float]()


def _cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests that used the most CPU (own + reaped children) and the CPU and "
        "wall seconds of every file (N=0: every test)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # makereport runs right after each phase: the CPU since the phase began is the phase's.
    report = yield
    if _START in item.stash:
        report.user_properties.append((CPU_PROPERTY, _cpu_now() - item.stash[_START]))
    item.stash[_START] = _cpu_now()  # the next phase starts here
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_START] = _cpu_now()
    return (yield)


def _reports(terminal: Any) -> list[pytest.TestReport]:
    return [
        r
        for reports in terminal.stats.values()
        for r in reports
        if isinstance(r, pytest.TestReport)
    ]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.getoption("--cpu-durations")
    if count is None:
        return
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for report in _reports(terminalreporter):
        cpu[report.nodeid] += sum(v for k, v in report.user_properties if k == CPU_PROPERTY)
        wall[report.nodeid] += report.duration
    if not wall:
        return
    write = terminalreporter.write_line
    terminalreporter.section("CPU durations (own + reaped children, setup+call+teardown)")
    ranked = sorted(cpu, key=lambda n: -cpu[n])
    for nodeid in ranked[:count] if count else ranked:
        write(f"{cpu[nodeid]:8.2f}s cpu {wall[nodeid]:8.2f}s wall  {nodeid}")
    files_cpu: dict[str, float] = defaultdict(float)
    files_wall: dict[str, float] = defaultdict(float)
    for nodeid in wall:
        path = nodeid.split("::", 1)[0]
        files_cpu[path] += cpu[nodeid]
        files_wall[path] += wall[nodeid]
    terminalreporter.section("per file")
    for path in sorted(files_cpu, key=lambda p: -files_cpu[p])[: count or None]:
        write(f"{files_cpu[path]:8.2f}s cpu {files_wall[path]:8.2f}s wall  {path}")
    write(
        f"sum over {len(wall)} tests: {sum(cpu.values()):.1f} s cpu, "
        f"{sum(wall.values()):.1f} s wall"
    )
