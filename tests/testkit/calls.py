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
