"""What a failed or hung run's failure record says, in words every surface shows the same way.

The run page, ``cptrace analyze`` and the pull-request comment all lead with one headline made
here: which rank raised what where (``FailureRecord.exception``), or, for a job the watchdog
stopped, where each rank was waiting (the innermost frame of user code in each rank's
``faulthandler`` dump, ``FailureRecord.stacks``).

======================================================  ============================================
failure record                                          headline
======================================================  ============================================
``exception`` {type, message, where}, ``failed_rank``   rank 1 raised ValueError: 8190 ... at
                                                        train.py:41 in step
``stacks`` {"0": dump, "1": dump}, watchdog stopped     the job hung and the watchdog stopped it
                                                        after 3 s; rank 0 waiting at train.py:30
                                                        in step; rank 1 waiting at ...
``summary`` only                                        the summary
======================================================  ============================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from analyzers.manifest import FailureRecord
from contracts.validation import first_error

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>.*)$')
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+ ")
_LIBRARY = re.compile(r"(?:/|\\)(?:site-packages|dist-packages|lib/python3\.\d+)(?:/|\\)")
MAX_HEADLINE = 500
"""Characters of an exception message kept in the headline (the page shows all of it)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a faulthandler dump."""

    file: str
    line: int
    function: str

    def where(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True, slots=True)
class RankStack:
    """One rank's dump: the whole text, and the frame it was waiting in."""

    rank: str
    text: str
    waiting_at: Frame | None


def _threads(text: str) -> list[tuple[bool, list[Frame]]]:
    """(is the dumping thread, frames innermost first) per thread of a faulthandler dump."""
    threads: list[tuple[bool, list[Frame]]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append((head["current"] == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame:
            if not threads:  # a dump of one thread has no header line
                threads.append((True, []))
            threads[-1][1].append(Frame(frame["file"], int(frame["line"]), frame["function"]))
    return threads


def waiting_frame(text: str) -> Frame | None:
    """Where a rank was waiting: the innermost frame of its main thread outside the standard
    library and installed packages (the user's line), else its innermost frame.

    The main thread is the one that took the signal ("Current thread"); without that marker,
    the last thread listed (faulthandler lists the main thread last).
    """
    threads = [t for t in _threads(text) if t[1]]
    if not threads:
        return None
    frames = next((f for current, f in threads if current), threads[-1][1])
    return next((f for f in frames if not _LIBRARY.search(f.file)), frames[0])


def rank_stacks(failure: FailureRecord) -> list[RankStack]:
    """Each rank's stack, in rank order (numeric ranks first)."""

    def order(rank: str) -> tuple[int, int | str]:
        return (0, int(rank)) if rank.isdigit() else (1, rank)

    return [
        RankStack(rank, failure.stacks[rank], waiting_frame(failure.stacks[rank]))
        for rank in sorted(failure.stacks, key=order)
    ]


def failure_of(manifest: Mapping[str, Any] | None) -> FailureRecord | None:
    """The failure record of a stored manifest (its JSON), None for a job that ended cleanly.

    A record that does not fit the model (a manifest stored by an older cptrace) still says
    the job failed, and why it cannot say more, rather than failing the page.
    """
    raw = (manifest or {}).get("failure")
    if not isinstance(raw, dict):
        return None
    try:
        return FailureRecord.model_validate(raw)
    except ValidationError as exc:
        return FailureRecord(summary=f"the failure record is unreadable ({first_error(exc)})")


def _one_line(text: str, limit: int = MAX_HEADLINE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def raised(failure: FailureRecord) -> str | None:
    """``rank 1 raised ValueError: message at file:line in function``; None without one."""
    exception = failure.exception
    if not exception:
        return None
    who = f"rank {failure.failed_rank}" if failure.failed_rank is not None else "a rank"
    text = f"{who} raised {exception.get('type') or 'an exception'}"
    if exception.get("message"):
        text += f": {exception['message']}"
    where = exception.get("where")
    if isinstance(where, dict) and where.get("file"):
        text = _one_line(text) + f" at {where['file']}:{where.get('line', '?')}"
        if where.get("function"):
            text += f" in {where['function']}"
    waiting = [
        f"rank {rank} was waiting in {state['collective']}"
        for rank, state in sorted(failure.ranks.items())
        if state.get("state") == "waiting" and state.get("collective")
    ]
    return _one_line("; ".join([text, *waiting]), MAX_HEADLINE * 2)


def hung(failure: FailureRecord) -> str | None:
    """``the job hung ...; rank 0 waiting at file:line in f; ...``; None without stacks."""
    stacks = rank_stacks(failure)
    if not stacks:
        return None
    how = "the job hung"
    if failure.stopped_by_watchdog or failure.timed_out:
        after = f" after {failure.watchdog_s:g} s" if failure.watchdog_s is not None else ""
        how += f" and the watchdog stopped it{after}"
    waits = [
        f"rank {s.rank} waiting at {s.waiting_at.where() if s.waiting_at else '(no frame)'}"
        for s in stacks
    ]
    return f"{how}; " + "; ".join(waits)


def failure_headline(failure: FailureRecord) -> str:
    """One line: the exception when a rank raised, else where each rank was waiting, else the
    record's summary (never empty)."""
    text = raised(failure) or hung(failure) or _one_line(failure.summary)
    if text:
        return text
    if failure.exit_status is not None:
        return f"the job failed (exit status {failure.exit_status})"
    return "the job failed (no failure summary recorded)"


__all__ = [
    "Frame",
    "RankStack",
    "failure_headline",
    "failure_of",
    "hung",
    "raised",
    "rank_stacks",
    "waiting_frame",
]
