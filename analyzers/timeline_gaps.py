"""The idle gaps of the windows the dashboard timeline draws, from the step account.

Why: the run page reads stored reports only, and a stored account keeps only the largest
pieces per part (one per step, three per group); to draw every idle gap on the timeline,
labelled with its cause and helper ("idle: host-bound: get_cu_seqlens_on_cp_rank 1.2 ms"), the
report carries the idle pieces of
the drawn windows (one step per rank, ``Timeline.steps``) on the timeline's own clock. The
pieces are the account's (``analyzers.account.account_pieces``): the idle gap pieces and the
exposed NCCL time spent waiting for a later peer, so the drawn gaps add up to the account's idle
parts of those windows exactly; touching pieces of one cause are drawn as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np
from pydantic import TypeAdapter

from analyzers.account.build import Pieces, account_pieces
from analyzers.attribution import Attribution, RangeHelpers
from analyzers.catalog import Catalog
from analyzers.model import Trace
from analyzers.report import AccountPartKind, Timeline, TimelineGap, Window


def timeline_gaps(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    timelines: Sequence[Timeline],
    pieces_of: Callable[[Sequence[int]], Pieces] | None = None,
) -> list[Timeline]:
    """``timelines`` with the idle pieces of their windows (at most ``limit`` per rank, the
    longest; the rest counted in ``gaps_dropped``). ``pieces_of`` gives the pieces of the
    selected windows when an account already exists (``Accounts.pieces``, no second build).

    One account pass covers every drawn window when they are disjoint on each rank (the
    middle steps of different groups are); windows that overlap go one group at a time."""
    if not len(trace.activities):
        return list(timelines)
    wanted = [_drawn(t, windows) for t in timelines]
    everything = [i for sel in wanted for i in sel]
    if _disjoint([windows[i] for i in everything]):
        pieces = [_pieces(trace, att, ranges, catalog, windows, everything, pieces_of)] * len(
            timelines
        )
    else:
        pieces = [_pieces(trace, att, ranges, catalog, windows, sel, pieces_of) for sel in wanted]
    return [
        _with_gaps(t, p, windows, sel) if p is not None and sel else t
        for t, p, sel in zip(timelines, pieces, wanted, strict=True)
    ]


def drawn_windows(windows: Sequence[Window], timelines: Sequence[Timeline]) -> list[int]:
    """Indices of the windows ``timeline_gaps`` will ask the pieces of (every timeline's drawn
    steps): ``compute_accounts(keep=...)`` keeps them from its own passes."""
    return sorted({i for t in timelines for i in _drawn(t, windows)})


def _drawn(timeline: Timeline, windows: Sequence[Window]) -> list[int]:
    """Indices of the windows a timeline draws (one per rank)."""
    drawn = {(s.rank, s.window, s.index) for s in timeline.steps}
    return [
        i
        for i, w in enumerate(windows)
        if (w.group or w.name) == timeline.window and (w.rank, w.name, w.index) in drawn
    ]


def _disjoint(chosen: Sequence[Window]) -> bool:
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for w in chosen:
        by_rank.setdefault(w.rank, []).append((w.start_ns, w.end_ns))
    for spans in by_rank.values():
        spans.sort()
        if any(b[0] < a[1] for a, b in pairwise(spans)):
            return False
    return True


def _pieces(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    selected: Sequence[int],
    pieces_of: Callable[[Sequence[int]], Pieces] | None,
) -> Pieces | None:
    if not selected:
        return None
    if pieces_of is not None:
        return pieces_of(selected)
    return account_pieces(trace, att, ranges, catalog, windows, selected)


def _with_gaps(
    timeline: Timeline, pieces: Pieces, windows: Sequence[Window], selected: Sequence[int]
) -> Timeline:
    origin = {(s.rank, s.window, s.index): s.origin_ns for s in timeline.steps}
    mine = {(w.rank, w.name, w.index, w.group) for w in (windows[i] for i in selected)}
    # idle gap pieces, and the exposed NCCL time spent waiting for a later peer (an
    # activity's share, but idle in the account: the GPU waits for another rank)
    peer = [i for i, line in enumerate(pieces.lines) if line.part == AccountPartKind.IDLE_PEER]
    idle = np.flatnonzero((pieces.unit >= pieces.activities) | np.isin(pieces.line, peer))
    idle = idle[np.lexsort((pieces.start[idle], pieces.seg[idle]))]
    # pieces of this timeline's windows, on its clock
    of_window = [pieces.windows[j].window for j in range(len(pieces.windows))]
    drawn = [(w.rank, w.name, w.index, w.group) in mine for w in of_window]
    idle = idle[np.array([*drawn, False])[pieces.seg[idle]]]
    shift = np.array(
        [
            origin[(w.rank, w.name, w.index)] if d else 0
            for w, d in zip(of_window, drawn, strict=True)
        ]
        + [0],
        dtype=np.int64,
    )
    rank_of = np.array([w.rank for w in of_window] + [0], dtype=np.int64)
    seg = pieces.seg[idle]
    rank = rank_of[seg]
    start = pieces.start[idle] - shift[seg]
    end = start + pieces.duration[idle]
    kinds: dict[tuple[AccountPartKind, str], int] = {}
    kind_of = np.array(
        [kinds.setdefault((line.part, line.label), len(kinds)) for line in pieces.lines],
        dtype=np.int64,
    )
    kind = kind_of[pieces.line[idle]]
    # touching pieces of one rank and (part, label), consecutive in (window, start) order, are
    # drawn as one gap: from its first piece's start to its last piece's end
    new = np.ones(len(idle), dtype=bool)
    new[1:] = ~((rank[1:] == rank[:-1]) & (end[:-1] == start[1:]) & (kind[1:] == kind[:-1]))
    heads = np.flatnonzero(new)
    tails = heads[1:] - 1 if len(heads) else heads
    tails = np.append(tails, len(idle) - 1) if len(heads) else tails
    g_rank, g_start, g_end, g_kind = rank[heads], start[heads], end[tails], kind[heads]
    named = list(kinds)
    kept: list[dict[str, object]] = []
    dropped = 0
    for r in sorted(set(g_rank.tolist())):
        mine_rows = np.flatnonzero(g_rank == r)
        # the ``limit`` longest (ties: first drawn first), then in time order
        longest = mine_rows[np.argsort(g_start[mine_rows] - g_end[mine_rows], kind="stable")]
        chosen = longest[: timeline.limit]
        chosen = chosen[np.argsort(g_start[chosen], kind="stable")]
        for a, b, k in zip(
            g_start[chosen].tolist(), g_end[chosen].tolist(), g_kind[chosen].tolist(), strict=True
        ):
            part, label = named[k]
            kept.append({"rank": r, "start_ns": a, "end_ns": b, "part": part, "label": label})
        dropped += max(len(mine_rows) - timeline.limit, 0)
    gaps = _GAPS.validate_python(kept)
    return timeline.model_copy(update={"gaps": gaps, "gaps_dropped": dropped})


_GAPS = TypeAdapter(list[TimelineGap])
"""Validates a timeline's gaps in one call: thousands of them per timeline, and one
validation of the list costs half of one model construction per gap."""


__all__ = ["drawn_windows", "timeline_gaps"]
