"""Find the time windows a trace is analysed in: steps, A/B variant windows, the whole trace.

Why windows matter: a trace of an interleaved A/B run holds several variants; per-helper numbers
only mean something per step of one variant. Sources, per rank, in this order:

* variant windows named by the manifest (``window_names``, e.g. ``"arm:auto_clone"``): every
  range with exactly that name;
* steps (``choose_steps``): ranges whose name ``step_pattern`` finds when it is given; else
  ``ProfilerStep#N``; else NVTX / ``record_function`` ranges named like steps (``step 3``,
  ``Step 3``, ``iteration 3``, ``iter 3``, ``train_step``, ``training_step 3``); else the
  uncatalogued top-level range of a launching thread that repeats at least
  ``REPEATED_STEPS`` times and covers at least half of its rank's launch span (a training
  loop's own ``record_function("train")``). The last two are stated in a report note. A step
  is grouped under the variant that encloses it or, when
  the step encloses the variant instead (``ProfilerStep#4`` around ``arm:explicit_false``, as
  ``runners`` records profiled A/B steps), under the one variant it wraps; otherwise under its
  name with the trailing step number removed ("ProfilerStep"). A step wrapping windows of two
  different variants stays in the step group (it mixes arms);
* a variant window with no step inside counts as one step of its own group;
* one "whole trace" window per rank, always (the span of that rank's rows).

Ranges recorded on GPU streams (Kineto ``gpu_user_annotation`` mirrors of CPU annotations) are
skipped: they would count every step twice. They are recognised by their thread never launching
anything while the same name also occurs on a launching thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from analyzers.model import RangeKind, Trace, launch_calls
from analyzers.report import Window

WHOLE_TRACE = "whole trace"
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
NAMED_STEP = re.compile(
    r"^(?:train(?:ing)?[_ ]?)?(?:step|iter(?:ation)?)(?:[\s#:_\-]*\d+)?$", re.IGNORECASE
)
"""Names people give their step ranges: ``step 3``, ``Step_3``, ``iteration 3``, ``iter 3``,
``train_step``, ``training step 3``."""
REPEATED_STEPS = 3
"""A top-level range must repeat this many times on one launching thread to be a step."""
REPEATED_COVERAGE = 0.5
"""... and its repeats must cover this share of its rank's launch span (first to last launch):
a short helper range repeated every step is not the step."""
_ANNOTATION_KINDS = (RangeKind.NVTX, RangeKind.RECORD_FUNCTION, RangeKind.STEP)


class StepSource(StrEnum):
    """Where the step ranges of an analysis came from."""

    PATTERN = "--step-pattern"
    PROFILER_STEP = "ProfilerStep#N"
    NAMED = "ranges named like steps"
    REPEATED = "a top-level range repeated on the launching thread"
    NONE = "no step ranges"


@dataclass(frozen=True, slots=True)
class StepChoice:
    """The symbols of the step ranges and why they were chosen."""

    symbols: frozenset[int]
    source: StepSource
    names: tuple[str, ...] = ()

    @property
    def note(self) -> str | None:
        """The report note stating a choice made without flags (None for the defaults)."""
        if self.source not in (StepSource.NAMED, StepSource.REPEATED):
            return None
        shown = ", ".join(repr(n) for n in self.names[:4])
        more = f" and {len(self.names) - 4} more" if len(self.names) > 4 else ""
        return (
            f"steps: the trace has no ProfilerStep#N; measured per {shown}{more} range "
            f"({self.source.value}); pass --step-pattern REGEX to choose other ranges"
        )


def choose_steps(
    trace: Trace,
    step_pattern: str | None = None,
    exclude: Callable[[str], bool] | None = None,
) -> StepChoice:
    """The step ranges of ``trace`` (see the module docstring for the order of sources).

    Args:
        step_pattern: a regular expression for step names; overrides everything else.
        exclude: names that are never steps (the pipeline passes catalogued helper ranges).

    :raises re.error: when ``step_pattern`` is not a valid regular expression.
    """
    present = np.unique(trace.ranges["name"]).tolist()
    if step_pattern:
        regex = re.compile(step_pattern)
        found = {s for s in present if regex.search(trace.strings[s])}
        return StepChoice(frozenset(found), StepSource.PATTERN, _names(trace, found))
    found = {s for s in present if PROFILER_STEP.search(trace.strings[s])}
    if found:
        return StepChoice(frozenset(found), StepSource.PROFILER_STEP, _names(trace, found))
    annotation = np.isin(trace.ranges["kind"], np.array(_ANNOTATION_KINDS, dtype=np.int8))
    kinds_present = set(np.unique(trace.ranges["name"][annotation]).tolist())
    skip = exclude or (lambda _: False)
    found = {
        s
        for s in kinds_present
        if NAMED_STEP.match(trace.strings[s]) and not skip(trace.strings[s])
    }
    if found:
        return StepChoice(frozenset(found), StepSource.NAMED, _names(trace, found))
    repeated = _repeated_top_level(trace, annotation, skip)
    if repeated is not None:
        return StepChoice(frozenset({repeated}), StepSource.REPEATED, (trace.strings[repeated],))
    return StepChoice(frozenset(), StepSource.NONE)


def _names(trace: Trace, symbols: set[int]) -> tuple[str, ...]:
    return tuple(sorted(trace.strings[s] for s in symbols))


def _repeated_top_level(
    trace: Trace, annotation: npt.NDArray[np.bool_], skip: Callable[[str], bool]
) -> int | None:
    """The symbol of the longest-covering uncatalogued top-level range repeated on a launching
    thread (None when no range qualifies)."""
    table = trace.ranges
    calls = trace.launches[launch_calls(trace.launches)]
    if len(calls) == 0:
        return None
    spans = {}
    for r in np.unique(calls["rank"]).tolist():
        mine = calls[calls["rank"] == r]
        spans[int(r)] = int(mine["end"].max() - mine["start"].min())
    top = annotation & (table["depth"] == 0) & np.isin(table["thread"], np.unique(calls["thread"]))
    rows = table[top]
    best: tuple[int, int] | None = None
    for symbol in np.unique(rows["name"]).tolist():
        mine = rows[rows["name"] == symbol]
        _, per_thread = np.unique(mine["thread"], return_counts=True)
        if per_thread.max() < REPEATED_STEPS or skip(trace.strings[symbol]):
            continue
        covered = int((mine["end"] - mine["start"]).sum())
        span = sum(spans.get(int(r), 0) for r in np.unique(mine["rank"]).tolist())
        if span <= 0 or covered < REPEATED_COVERAGE * span:
            continue
        if best is None or covered > best[0]:
            best = (covered, int(symbol))
    return best[1] if best else None
_STEP_NUMBER = re.compile(r"\s*[#:_\- ]?\d+$")


def step_group_name(name: str) -> str:
    """``ProfilerStep#12`` -> ``ProfilerStep``; ``iter 3`` -> ``iter``; names without a number
    stay as they are."""
    stripped = _STEP_NUMBER.sub("", name)
    return stripped or name


def _range_ranks(trace: Trace) -> npt.NDArray[np.int64]:
    ranks = trace.ranges["rank"].astype(np.int64)
    unknown = ranks < 0
    if unknown.any():
        ranks[unknown] = [trace.ranks.get(int(p), -1) for p in trace.ranges["process"][unknown]]
    return ranks


def _cpu_rows(trace: Trace, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Drop ranges on threads that launch nothing when the same name exists on a launching one."""
    if len(rows) == 0:
        return rows
    # the thread column of the launch calls only: copying whole launch rows cost more than the rest
    threads = trace.launches["thread"][launch_calls(trace.launches)]
    if len(threads) == 0:
        return rows
    launching = np.isin(trace.ranges["thread"][rows], np.unique(threads))
    names = trace.ranges["name"][rows]
    keep = launching | ~np.isin(names, names[launching])
    return rows[keep]


def _rows_named(trace: Trace, symbols: set[int]) -> npt.NDArray[np.int64]:
    if not symbols:
        return np.empty(0, dtype=np.int64)
    mask = np.isin(trace.ranges["name"], np.fromiter(symbols, dtype=np.int64))
    return _cpu_rows(trace, np.flatnonzero(mask).astype(np.int64))


def _rank_extents(trace: Trace) -> dict[int, tuple[int, int]]:
    """Per rank: earliest start and latest end over activities, launches and ranges (one pass
    per table and column for all ranks, not a mask per rank)."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for table in (trace.activities, trace.launches, trace.ranges):
        if len(table) == 0:
            continue
        rank = table["rank"].astype(np.int64)
        low = int(rank.min())
        code = rank - low
        n = int(code.max()) + 1
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(first, code, table["start"].astype(np.int64))
        np.maximum.at(last, code, table["end"].astype(np.int64))
        for k in np.flatnonzero(np.bincount(code, minlength=n)).tolist():
            starts.setdefault(k + low, []).append(int(first[k]))
            ends.setdefault(k + low, []).append(int(last[k]))
    return {r: (min(starts[r]), max(ends[r])) for r in starts}


def _whole_trace(trace: Trace, rank: int, extents: dict[int, tuple[int, int]]) -> Window:
    start, end = extents.get(rank, trace.span)
    return Window(
        rank=rank,
        name=WHOLE_TRACE,
        index=0,
        kind="trace",
        start_ns=start,
        end_ns=end,
        group=WHOLE_TRACE,
    )


def _overlap(w: Window, start: int, end: int) -> int:
    return max(0, min(w.end_ns, end) - max(w.start_ns, start))


def _variant_of(variants: list[Window], rank: int, start: int, end: int) -> str | None:
    """The variant enclosing the step, else the single variant the step wraps.

    "Wraps" means the step covers more than half of the variant window: a profiler step opened
    just before the arm's range and closed just after it.
    """
    mine = [w for w in variants if w.rank == rank]
    for w in mine:
        if w.start_ns <= start and end <= w.end_ns:
            return w.name
    wrapped = {w.name for w in mine if 2 * _overlap(w, start, end) > w.end_ns - w.start_ns}
    return wrapped.pop() if len(wrapped) == 1 else None


def find_windows(
    trace: Trace,
    step_pattern: str | None = None,
    window_names: Sequence[str] = (),
    steps: StepChoice | None = None,
) -> list[Window]:
    """Windows of every rank, ordered by group, rank and time (see the module docstring).

    ``steps``: the step ranges already chosen (``choose_steps``); by default chosen here from
    ``step_pattern``.

    :raises re.error: when ``step_pattern`` is not a valid regular expression.
    """
    steps = steps if steps is not None else choose_steps(trace, step_pattern)
    ranks = _range_ranks(trace)
    variant_symbols = {s for n in window_names if (s := trace.strings.lookup(n)) is not None}
    variants = [
        Window(
            rank=int(ranks[r]),
            name=trace.strings[int(trace.ranges["name"][r])],
            index=0,
            kind="window",
            start_ns=int(trace.ranges["start"][r]),
            end_ns=int(trace.ranges["end"][r]),
        )
        for r in _rows_named(trace, variant_symbols)
    ]
    step_rows = _rows_named(trace, set(steps.symbols) - variant_symbols)
    windows: list[Window] = []
    seen: set[tuple[int, int, int]] = set()
    for r in step_rows[np.argsort(trace.ranges["start"][step_rows], kind="stable")]:
        rank, start, end = int(ranks[r]), int(trace.ranges["start"][r]), int(trace.ranges["end"][r])
        if (rank, start, end) in seen:
            continue  # the same step recorded twice (NVTX and record_function)
        seen.add((rank, start, end))
        name = trace.strings[int(trace.ranges["name"][r])]
        group = _variant_of(variants, rank, start, end) or step_group_name(name)
        windows.append(
            Window(
                rank=rank, name=name, index=0, kind="step", start_ns=start, end_ns=end, group=group
            )
        )
    for v in variants:
        holds_steps = any(
            w.rank == v.rank and w.group == v.name and _overlap(v, w.start_ns, w.end_ns) > 0
            for w in windows
        )
        if not holds_steps:
            windows.append(v.model_copy(update={"group": v.name}))
    rank_list = sorted(set(np.unique(ranks).tolist()) | set(trace.rank_list()))
    extents = _rank_extents(trace)
    windows.extend(_whole_trace(trace, rank, extents) for rank in rank_list)
    return _numbered(windows)


def _numbered(windows: list[Window]) -> list[Window]:
    """Sort by (group order of first appearance, rank, start) and number within (rank, group)."""
    group_order: dict[str, int] = {}
    for w in sorted(windows, key=lambda w: w.start_ns):
        if w.group != WHOLE_TRACE:
            group_order.setdefault(w.group or w.name, len(group_order))
    group_order[WHOLE_TRACE] = len(group_order)
    ordered = sorted(windows, key=lambda w: (group_order[w.group or w.name], w.rank, w.start_ns))
    counters: dict[tuple[int, str], int] = {}
    out = []
    for w in ordered:
        key = (w.rank, w.group or w.name)
        out.append(w.model_copy(update={"index": counters.get(key, 0)}))
        counters[key] = counters.get(key, 0) + 1
    return out


def group_names(windows: Sequence[Window]) -> list[str]:
    """Distinct window groups in report order ("whole trace" last)."""
    names: list[str] = []
    for w in windows:
        group = w.group or w.name
        if group not in names:
            names.append(group)
    return names


__all__ = [
    "NAMED_STEP",
    "PROFILER_STEP",
    "WHOLE_TRACE",
    "StepChoice",
    "StepSource",
    "choose_steps",
    "find_windows",
    "group_names",
    "step_group_name",
]
