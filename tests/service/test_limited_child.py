"""The one limited child process (``service.limited_child``): each outcome of its protocol on a
real spawned process, and that no other module of ours spawns a limited child of its own."""

from __future__ import annotations

import ast
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from analyzers.errors import CorruptTraceError
from service.limited_child import (
    CallOutOfMemory,
    CallTimedOut,
    ChildDied,
    ChildError,
    LimitedChild,
)

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

REPO = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024 * 1024  # 1 GiB: the interpreter fits, a 2 GiB buffer does not


def _double(x: int) -> int:
    return 2 * x


def _counting(n: int, progress: Callable[[str], None]) -> int:
    for i in range(n):
        progress(f"step {i}")
    return n


def _raise_corrupt(name: str) -> None:
    raise CorruptTraceError(f"{name}: not a trace")


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickling calls __init__(msg): fails
        super().__init__(f"{a}+{b}")


def _raise_unpicklable() -> None:
    raise _Unpicklable(1, 2)


def _allocate(n: int) -> int:
    return len(bytearray(n))


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def child() -> Iterator[LimitedChild]:
    process = LimitedChild(memory_limit_bytes=LIMIT, name="cptrace-test-child")
    yield process
    process.kill()


def test_answers_calls_one_after_another_with_progress(child: LimitedChild) -> None:
    assert child.call(_double, 21, time_limit_s=30) == 42
    lines: list[str] = []
    assert child.call(_counting, 3, time_limit_s=30, progress=lines.append) == 3
    assert lines == ["step 0", "step 1", "step 2"]
    assert child.alive()


def test_the_childs_exception_comes_back_as_itself(child: LimitedChild) -> None:
    with pytest.raises(CorruptTraceError, match=r"x\.json: not a trace"):
        child.call(_raise_corrupt, "x.json", time_limit_s=30)
    with pytest.raises(ChildError, match=r"_Unpicklable: 1\+2"):
        child.call(_raise_unpicklable, time_limit_s=30)
    assert child.call(_double, 1, time_limit_s=30) == 2  # still serving


def test_memory_past_the_limit_ends_the_child() -> None:
    process = LimitedChild(memory_limit_bytes=LIMIT, name="cptrace-test-child")
    try:
        assert process.call(_allocate, 1024, time_limit_s=30) == 1024
        with pytest.raises(CallOutOfMemory):
            process.call(_allocate, 2 * LIMIT, time_limit_s=30)
        assert not process.alive()
    finally:
        process.kill()


def test_a_call_past_its_deadline_kills_the_child() -> None:
    process = LimitedChild(memory_limit_bytes=LIMIT, name="cptrace-test-child")
    try:
        started = time.monotonic()
        with pytest.raises(CallTimedOut, match=r"0\.5 s"):
            process.call(_sleep, 60, time_limit_s=0.5)
        assert time.monotonic() - started < 30
        assert not process.alive()
    finally:
        process.kill()


def test_a_child_that_dies_says_how() -> None:
    process = LimitedChild(memory_limit_bytes=LIMIT, name="cptrace-test-child")
    try:
        with pytest.raises(ChildDied, match="killed by SIGKILL"):
            process.call(_kill_self, time_limit_s=30)
    finally:
        process.kill()


def _calls(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                yield func.attr
            elif isinstance(func, ast.Name):
                yield func.id


def test_no_other_module_runs_a_limited_child_of_its_own() -> None:
    """One home: a second ``setrlimit`` or spawned pipe protocol would be a second executor."""
    found = []
    for package in ("service", "web", "cptrace", "pr_bot"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "service" / "limited_child.py":
                continue
            hits = {"setrlimit", "Pipe", "get_context"} & set(_calls(path))
            if hits:
                found.append(f"{path.relative_to(REPO)}: {', '.join(sorted(hits))}")
    assert not found, "limited children outside service/limited_child.py:\n" + "\n".join(found)
