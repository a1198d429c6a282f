"""Which of our functions a piece of code calls: ``sys.setprofile`` on their code objects.

An observation, not a mock: the functions run as they are; the profile hook only records each
call of the ones named. Used where "does not do X again" is the contract (the typed analysis
inputs are never sniffed again).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


@contextmanager
def calls_of(*functions: Callable[..., Any]) -> Iterator[list[str]]:
    """The names of ``functions`` called while open, one entry per call, in order."""
    codes = {f.__code__ for f in functions}
    seen: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            seen.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


@contextmanager
def bytes_yielded(generator_function: Callable[..., Any]) -> Iterator[list[int]]:
    """The bytes each run of ``generator_function`` yielded while open: one entry per
    generator it made, in the order they started (how much one inflate produced, say).

    Only the calling thread is observed, as with ``calls_of``.
    """
    code = generator_function.__code__
    runs: dict[int, int] = {}  # id(frame) -> index in totals
    frames: list[FrameType] = []  # held so that no finished frame's id is reused meanwhile
    totals: list[int] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code is not code:
            return
        if id(frame) not in runs:
            runs[id(frame)] = len(totals)
            frames.append(frame)
            totals.append(0)
        if event == "return" and isinstance(arg, bytes | bytearray | memoryview):
            totals[runs[id(frame)]] += len(arg)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield totals
    finally:
        sys.setprofile(previous)
        frames.clear()
